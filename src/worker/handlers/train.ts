import { InvalidMessageError, PeerUnreachableError } from '../../errors.ts';
import {
  encodeControl, encodeTensor, expectTensors, fromWire, MAX_TENSORS_PER_REQUEST, parseGrads, parseName, parseNames, parsePass,
  parseReduce, parseSetMoments, parseStep, parseTrainCompute, parseTrainSetup, sendMessage, STAGE_PROTOCOL, type TrainCompute, toWire,
} from '../../p2p/index.ts';
import { type CausalLM, weightsWithAdapter } from '../../models/index.ts';
import { DeviceSection, GradientExchange, type GradientPayload, type ReduceGroup, StageExecutor } from '../../pipeline/index.ts';
import { computeDevice, computeName, getBackend, loadBackend, type Tensor } from '../../tensor/index.ts';
import { gradsHash, hashTensors, sectionCost, type WorkRecord } from '../../verify/index.ts';
import { DctTopkCodec, type DctTopkOptions, type HopPart, hopIn, hopOut } from '../../compress/index.ts';
import { passKey, PassInbox } from '../passes.ts';
import { countSent, type JobEntry } from '../jobs.ts';
import { TrainingRecords } from '../records.ts';
import { fixChange, takeTrialAnchor, trialHandlers } from './trial.ts';
import { control, NONE, sectionOf, type StageContext, type StageHandler, type StageReply, type StageRequest, trainingOf } from './types.ts';

/**
 * Bytes a micro-batch of shape [B, T] keeps for its backward in a section: per block about
 * 17·H + 2.5·heads·T floats per token (the saved inputs of its norms, projections, attention
 * probabilities and MLP: Korthikanti et al., 2022, at float32), plus each other layer's output;
 * with recomputation, only the section's input.
 */
export function activationBytes(model: CausalLM, shape: readonly number[], recompute: boolean): number {
  const tokens = (shape[0] ?? 1) * (shape[1] ?? 1);
  if (recompute) return 4 * shape.reduce((a, b) => a * b, 1);
  const { hidden, heads } = model.config;
  const T = shape[1] ?? 1;
  return model.layers.reduce((sum, l) => sum + tokens * (l.kind === 'block' ? 4 * (17 * hidden + 2.5 * heads * T) : l.profile().activationBytesPerToken), 0);
}

function one(r: StageRequest) {
  return fromWire(expectTensors(r.type, r.tensors, 1)[0]);
}

/** A forward's input or a backward's gradient: with the request, or passed here by a neighbour under `from`. */
async function hopInput(r: StageRequest, hop: TrainCompute, passes: PassInbox): Promise<Tensor> {
  if (hop.from === null) return hopIn(expectTensors(r.type, r.tensors, 1)[0]);
  expectTensors(r.type, r.tensors, 0);
  return passes.take(passKey(hop.from.peer, hop.from.key));
}

/**
 * A result that goes on to a neighbour of the job (`to`) as a train-pass, before the owner is
 * answered with its record and shape; otherwise the result itself is the answer.
 */
async function sendOn(
  r: StageRequest,
  hop: TrainCompute,
  result: Tensor,
  part: HopPart,
  record: WorkRecord,
  context: StageContext,
): Promise<StageReply> {
  if (!hop.to) return { kind: 'tensor', tensor: result, record, part };
  const target = context.jobs.peerOf(r.job, hop.to.peer);
  const id = ++passes;
  const header = encodeControl({ type: 'train-pass', id, jobId: r.job.jobId, key: hop.to.key, tensors: 1 });
  try {
    const stream = await context.peers.to(target, STAGE_PROTOCOL);
    const [head, payload] = encodeTensor({ requestId: id, ...part });
    countSent(r.job, 'activations', [header, head], [payload]);
    await sendMessage(stream, [header, head, payload], { stallMs: context.stallMs });
  } catch (cause) {
    // the neighbour is the one that failed: the owner is told which, and blames it
    const text = cause instanceof Error ? cause.message : String(cause);
    throw new PeerUnreachableError(`cannot pass the result on to ${hop.to.peer}: ${text}`, { details: { about: hop.to.peer }, cause });
  }
  return control('passed', { record, shape: result.shape });
}

/**
 * How this worker sends its share of a reduction or an average to the other holders of a
 * group: only to holders in the job's assignment (checked before anything is sent).
 */
function holderSender(job: JobEntry, group: ReduceGroup, { jobs, peers, stallMs }: StageContext) {
  const targets = group.peers.map((p, i) => (i === group.index ? null : jobs.peerOf(job, p)));
  let sent = 0;
  return async (peer: string, grads: GradientPayload): Promise<void> => {
    const target = targets[group.peers.indexOf(peer)];
    if (!target) throw new InvalidMessageError(`${peer} is not a holder of ${group.key}`);
    const stream = await peers.to(target, STAGE_PROTOCOL);
    const id = ++sent;
    const header = encodeControl({ type: 'grads', id, jobId: job.jobId, key: group.key, index: group.index, tensors: grads.length });
    const wires = grads.map((g: Tensor | Uint8Array) => (g instanceof Uint8Array ? { requestId: id, dtype: 'uint8' as const, shape: [g.length], bytes: g } : toWire(g, id)));
    const frames = wires.map((w) => encodeTensor(w));
    countSent(job, 'gradients', [header, ...frames.map((f) => f[0])], frames.map((f) => f[1]));
    await sendMessage(stream, [header, ...frames.flat()], { stallMs });
  };
}

/** The micro-batches' gradients an ordered reduction kept are let go (a step took them, or a reset dropped them). */
function releaseMicros(job: JobEntry, memory: StageContext['memory']): void {
  const { micros } = trainingOf(job);
  if (micros.held === 0) return;
  memory.add(job.jobId, 'gradients', -micros.held * micros.bytes, 'the micro-batches\' kept gradients, let go');
  micros.held = 0;
}

/** Ids of the train-pass messages this worker sent (each the answer nobody waits for). */
let passes = 0;

/**
 * The training side of the stage protocol, on a loaded section: a StageExecutor per job
 * (its own AdamW), forwards and backwards per micro-batch, the reduction of gradients among
 * the job's holders of the same parameters (worker to worker, only to peers of the job's
 * assignment), the optimizer step, and reading and restoring weights and optimizer state.
 */
export const trainingHandlers: Record<string, StageHandler> = {
  ...trialHandlers,
  'train-setup': {
    run: ({ body, job }, { memory, signer, fault }) => {
      const section = sectionOf(job);
      const request = parseTrainSetup(body);
      // checked before anything is held: bad settings are the owner's error
      const codec = request.compressGrads ? new DctTopkCodec(request.compressGrads as DctTopkOptions) : null;
      // gradients and AdamW's two moments, each the size of the weights, counted before they exist; with
      // verification on, the state each step starts from (weights, moments, gradients) is kept until the next
      // of the weights it trains only: a frozen base (under an adapter) has neither
      const bytes = 4 * section.model.trainableParameters().reduce((n, p) => n + p.size, 0);
      const snapshot = request.keepState ? 4 * bytes : 0;
      // local steps keep the weights they started from (the anchor of the next average, and scoring's copy of it), and
      // an average holds the weights' change and the sum of all holders' changes besides
      const anchor = request.syncEvery > 1 ? 4 * bytes : 0;
      memory.holdAll(
        job.jobId,
        { gradients: bytes, optimizer: 2 * bytes + anchor, activations: 0, snapshot },
        request.keepState
          ? 'training this section (gradients, AdamW\'s two moments, and the state a step starts from for verification)'
          : 'training this section (gradients and AdamW\'s two moments)',
      );
      for (const p of request.peers) job.delegates.add(p);
      // each backward's contribution is hashed into its record (and a cheating worker alters it first); on
      // ort it is kept too, for a verifier to compare within tolerance
      // a GPU worker trains on its GPU (forward and backward as graphs there) where its backend and the section allow it;
      // records name what computed them (the CPU context again if the device refuses the section's steps)
      const device = computeDevice() === 'cpu' ? null : loadBackend(computeName());
      const onDevice = device !== null && DeviceSection.refusal(section.model, device) === null;
      const host = getBackend().name;
      let contribution = { hash: '', tensors: null as Map<string, Tensor> | null };
      const executor: StageExecutor = new StageExecutor(section.model.layers, section.model.config.maxPositions, {
        ...request,
        ...(onDevice ? { device } : {}),
        onContribution: (_micro, c) => {
          fault?.contribution(c);
          const tensors = request.keepState && records.backend !== 'js' ? new Map([...c].map(([n, t]) => [n, t.clone()])) : null;
          contribution = { hash: gradsHash(executor, c), tensors };
        },
      });
      const account = (delta: number) => memory.add(job.jobId, 'snapshot', delta, 'inputs kept for re-running records');
      const cost = sectionCost(section.model.config, section.range);
      const decay = request.weightDecay === undefined ? {} : { weightDecay: request.weightDecay };
      const setup = { config: section.configHash, cost, ...decay };
      const backendOf = () => executor.deviceName ?? host;
      const records = new TrainingRecords(job.jobId, section.range, signer, backendOf, executor, request.keepState, setup, account);
      const exchange = new GradientExchange(codec);
      if (request.syncEvery > 1) exchange.anchor(executor);
      section.training = {
        executor, exchange, kept: new Map(), recompute: request.recompute, records,
        contribution: () => contribution, forwardInputs: new Map(), passes: new PassInbox(),
        micros: { bytes: request.keepMicros ? bytes : 0, held: 0 },
      };
      if (request.syncEvery > 1) takeTrialAnchor(section.training);
      return control('train-ready', { names: [...executor.named.keys()] });
    },
  },
  'train-forward': {
    maxTensors: 1,
    run: async (r, context) => {
      const { work, memory, fault } = context;
      const hop = parseTrainCompute(r.body);
      // only to a worker of the job's own assignment, checked before anything runs: the owner cannot make a worker dial anyone else
      if (hop.to) context.jobs.peerOf(r.job, hop.to.peer);
      const training = trainingOf(r.job);
      const input = await hopInput(r, hop, training.passes);
      if (fault) await fault.delay();
      const micro = hop.micro;
      // what this micro-batch keeps for its backward is counted before the forward runs
      const kept = activationBytes(sectionOf(r.job).model, input.shape, training.recompute);
      memory.add(r.job.jobId, 'activations', kept - (training.kept.get(micro) ?? 0), `the activations of micro-batch ${micro}`);
      training.kept.set(micro, kept);
      const honest = training.executor.forward(micro, input);
      const tensor = fault ? fault.output('forward', honest, input) : honest;
      const { records } = training;
      // encoded once: the frame that leaves, and what its receiver computes on (its hash in the record)
      const out = hopOut(tensor, hop.codec);
      const sent = hop.codec ? { sent: hashTensors([out.received]) } : {};
      const record = records.sign(
        { kind: 'forward', micro, input: hashTensors([input]), output: hashTensors([tensor]), ...sent, weights: records.weightsHash() },
        input.shape[0] * input.shape[1],
      );
      training.forwardInputs.set(micro, { hash: record.input, tensor: records.keepState ? input.detach().clone() : null });
      // the output is kept without its graph, which would hold the forward's activations for as long
      records.keep({ record, input: training.forwardInputs.get(micro)!.tensor!, ...(record.backend === 'js' ? {} : { output: tensor.detach() }) });
      work.trainForwards++;
      work.trainTokens += input.shape[0] * input.shape[1];
      return sendOn(r, hop, tensor, out.part, record, context);
    },
  },
  'train-backward': {
    maxTensors: 1,
    run: async (r, context) => {
      const { work, memory, fault } = context;
      const hop = parseTrainCompute(r.body);
      if (hop.to) context.jobs.peerOf(r.job, hop.to.peer);
      const training = trainingOf(r.job);
      const micro = hop.micro;
      const { records } = training;
      if (!training.forwardInputs.has(micro)) throw new InvalidMessageError(`backward of micro-batch ${micro} before its forward`);
      const grad = await hopInput(r, hop, training.passes);
      if (fault) await fault.delay();
      const forward = training.forwardInputs.get(micro);
      if (!forward) throw new InvalidMessageError(`backward of micro-batch ${micro} before its forward`);
      // an ordered reduction's copy of this micro-batch's gradients is counted before it is made
      if (training.micros.bytes > 0) {
        memory.add(r.job.jobId, 'gradients', training.micros.bytes, `micro-batch ${micro}'s gradients, kept for the replicas' ordered reduction`);
        training.micros.held++;
      }
      const honest = training.executor.backward(micro, grad);
      const g: Tensor | null = honest && fault ? fault.output('backward', honest, grad) : honest;
      memory.add(r.job.jobId, 'activations', -(training.kept.get(micro) ?? 0), 'a backward');
      training.kept.delete(micro);
      training.forwardInputs.delete(micro);
      const { hash, tensors } = training.contribution();
      const out = g && hopOut(g, hop.codec);
      const sent = out && hop.codec ? { sent: hashTensors([out.received]) } : {};
      const record = records.sign({
        kind: 'backward', micro, input: hashTensors([grad]), output: g ? hashTensors([g]) : '', ...sent, grads: hash, from: forward.hash,
        weights: records.weightsHash(),
      }, grad.shape[0] * grad.shape[1]);
      const ort = record.backend !== 'js' ? { ...(g ? { output: g } : {}), ...(tensors ? { contribution: tensors } : {}) } : {};
      records.keep({ record, input: forward.tensor!, grad, ...ort });
      work.trainBackwards++;
      return g && out ? sendOn(r, hop, g, out.part, record, context) : control('no-input-gradient', { record });
    },
  },
  'train-pass': {
    delegates: true,
    maxTensors: 1,
    run: (r) => {
      // filed under its sender: another worker of the job cannot slip a tensor in under a key the owner gave someone else
      const { key } = parsePass(r.body);
      trainingOf(r.job).passes.deliver(passKey(r.from.toString(), key), hopIn(expectTensors(r.type, r.tensors, 1)[0]));
      return NONE;
    },
  },
  'grad-squares': {
    run: ({ body, job }) => control('grad-squares', { values: trainingOf(job).executor.gradSquares(parseNames(body.names)) }),
  },
  'grads': {
    delegates: true,
    maxTensors: MAX_TENSORS_PER_REQUEST,
    run: ({ body, tensors, job }) => {
      const { key, index } = parseGrads(body);
      // compressed gradients travel as their codec's bytes (decoded, and checked, when they are added)
      const compressed = tensors.length > 0 && tensors.every((t) => t.dtype === 'uint8');
      trainingOf(job).exchange.deliver(key, index, compressed ? tensors.map((t) => new Uint8Array(t.bytes)) : tensors.map(fromWire));
      return NONE;
    },
  },
  'reduce': {
    run: async ({ body, job }, context) => {
      const group = parseReduce(body);
      const { executor, exchange } = trainingOf(job);
      await exchange.reduce(executor, group, holderSender(job, group, context));
      return control('reduced');
    },
  },
  'sync': {
    run: async ({ body, job }, context) => {
      const group = parseReduce(body);
      const training = trainingOf(job);
      // the change it sends is the one its scoring saw (a faulty worker's, altered once)
      fixChange(training, context.fault);
      await training.exchange.average(training.executor, group, holderSender(job, group, context));
      training.executor.weightsChanged();
      training.records.invalidate();
      takeTrialAnchor(training);
      sectionOf(job).weightsHash = undefined;
      return control('synced', { weights: training.records.weightsHash() });
    },
  },
  'step': {
    run: ({ body, job }, { work, fault, memory }) => {
      const { scale, lr } = parseStep(body);
      const training = trainingOf(job);
      const record = training.records.stepWith(scale, lr, !(fault?.skipsStep() ?? false));
      training.exchange.commit();
      releaseMicros(job, memory);
      sectionOf(job).weightsHash = undefined; // decoding records hash the weights afresh
      work.optimizerSteps++;
      return control('stepped', { record, traffic: job.traffic });
    },
  },
  'weight': {
    run: ({ body, job }) => {
      // any loaded section's weight (the executor trains these same tensors in place)
      const name = parseName(body.name);
      const p = weightsWithAdapter(sectionOf(job).model).get(name);
      if (!p) throw new InvalidMessageError(`'${name}' is not a weight of this section`);
      return { kind: 'tensor', tensor: p };
    },
  },
  'moment-steps': {
    run: ({ body, job }) => {
      const { executor } = trainingOf(job);
      return control('moment-steps', { steps: parseNames(body.names).map((n) => executor.stepsOf(n)) });
    },
  },
  'moments': {
    run: ({ body, job }) => {
      const name = parseName(body.name);
      const m = trainingOf(job).executor.moments(name);
      if (!m) throw new InvalidMessageError(`'${name}' has no optimizer state yet`);
      return { kind: 'tensor', tensor: m.moments };
    },
  },
  'set-moments': {
    maxTensors: 1,
    run: (r) => {
      const { name, step } = parseSetMoments(r.body);
      const training = trainingOf(r.job);
      training.executor.setMoments(name, one(r), step);
      training.records.invalidate();
      return control('moments-set');
    },
  },
  'train-reset': {
    run: ({ job }, { memory }) => {
      const { executor, exchange, kept, records, forwardInputs, passes } = trainingOf(job);
      executor.reset();
      passes.clear();
      records.dropStep();
      forwardInputs.clear();
      exchange.clear();
      kept.clear();
      releaseMicros(job, memory);
      memory.hold(job.jobId, 'activations', 0, 'a reset');
      return control('reset');
    },
  },
};
