import { InvalidArgumentError, InvalidMessageError } from '../../errors.ts';
import {
  encodeControl, encodeTensor, expectTensors, fromWire, MAX_TENSORS_PER_REQUEST, parseGrads, parseMicro, parseName, parseNames,
  parseReduce, parseSetMoments, parseStep, parseTrainSetup, sendMessage, STAGE_PROTOCOL, toWire,
} from '../../p2p/index.ts';
import { GradientExchange, StageExecutor } from '../../pipeline/index.ts';
import { control, NONE, sectionOf, type StageHandler, type StageRequest, trainingOf } from './types.ts';

/** Bytes per parameter a trained section needs: weights, gradients and AdamW's two moments. */
export const TRAINING_BYTES_PER_PARAM = 16;

function one(r: StageRequest) {
  return fromWire(expectTensors(r.type, r.tensors, 1)[0]);
}

/**
 * The training side of the stage protocol, on a loaded section: a StageExecutor per job
 * (its own AdamW), forwards and backwards per micro-batch, the reduction of gradients among
 * the job's holders of the same parameters (worker to worker, only to peers of the job's
 * assignment), the optimizer step, and reading and restoring weights and optimizer state.
 */
export const trainingHandlers: Record<string, StageHandler> = {
  'train-setup': {
    run: ({ body, job }, { memoryBytes }) => {
      const section = sectionOf(job);
      const request = parseTrainSetup(body);
      const need = section.model.numParameters() * TRAINING_BYTES_PER_PARAM;
      if (need > memoryBytes) {
        throw new InvalidArgumentError(`training this section needs ${need} bytes (weights, gradients, AdamW state), this worker offers ${memoryBytes}`);
      }
      for (const p of request.peers) job.delegates.add(p);
      const executor = new StageExecutor(section.model.layers, section.model.config.maxPositions, request);
      section.training = { executor, exchange: new GradientExchange() };
      return control('train-ready', { names: [...executor.named.keys()] });
    },
  },
  'train-forward': {
    maxTensors: 1,
    run: (r, { work }) => {
      const input = one(r);
      const tensor = trainingOf(r.job).executor.forward(parseMicro(r.body), input);
      work.trainForwards++;
      work.trainTokens += input.shape[0] * input.shape[1];
      return { kind: 'tensor', tensor };
    },
  },
  'train-backward': {
    maxTensors: 1,
    run: (r, { work }) => {
      const g = trainingOf(r.job).executor.backward(parseMicro(r.body), one(r));
      work.trainBackwards++;
      return g ? { kind: 'tensor', tensor: g } : control('no-input-gradient');
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
      trainingOf(job).exchange.deliver(key, index, tensors.map(fromWire));
      return NONE;
    },
  },
  'reduce': {
    run: async ({ body, job }, { jobs, peers, stallMs }) => {
      const group = parseReduce(body);
      // gradients go only to holders in the job's assignment: checked before anything is sent
      const targets = group.peers.map((p, i) => (i === group.index ? null : jobs.peerOf(job, p)));
      const { executor, exchange } = trainingOf(job);
      let sent = 0;
      await exchange.reduce(executor, group, async (peer, grads) => {
        const target = targets[group.peers.indexOf(peer)];
        if (!target) throw new InvalidMessageError(`${peer} is not a holder of ${group.key}`);
        const stream = await peers.to(target, STAGE_PROTOCOL);
        const id = ++sent;
        const header = encodeControl({ type: 'grads', id, jobId: job.jobId, key: group.key, index: group.index, tensors: grads.length });
        await sendMessage(stream, [header, ...grads.flatMap((t) => encodeTensor(toWire(t, id)))], { stallMs });
      });
      return control('reduced');
    },
  },
  'step': {
    run: ({ body, job }, { work }) => {
      const { scale, lr } = parseStep(body);
      trainingOf(job).executor.step(scale, lr);
      work.optimizerSteps++;
      return control('stepped');
    },
  },
  'weight': {
    run: ({ body, job }) => {
      const name = parseName(body.name);
      const p = trainingOf(job).executor.named.get(name);
      if (!p) throw new InvalidMessageError(`'${name}' is not a parameter of this section`);
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
      trainingOf(r.job).executor.setMoments(name, one(r), step);
      return control('moments-set');
    },
  },
  'train-reset': {
    run: ({ job }) => {
      const { executor, exchange } = trainingOf(job);
      executor.reset();
      exchange.clear();
      return control('reset');
    },
  },
};
