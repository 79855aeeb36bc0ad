import { createHash } from 'node:crypto';
import { InvalidArgumentError } from '../errors.ts';
import { adaptModel, type CausalLM, configFromHF, createModel, KVCache, type LoraConfig, type ModelConfig, partBytes, weightsWithAdapter } from '../models/index.ts';
import { StageExecutor } from '../pipeline/index.ts';
import {
  formatBytes, getBackend, holdPacked, noGrad, packedFromBytes, packedTensor, type Tensor, WEIGHT_FORMATS, type WeightFormat, withBackend,
} from '../tensor/index.ts';
import { agree, type ComputeFormat, formatOfWeights } from './compare.ts';
import { recordFlops, sectionCost } from './flops.ts';
import { hashNamed, hashTensors } from './hash.ts';
import type { WorkRecord } from './records/index.ts';
import { gradsHash, optimizerHash, weightsHash } from './state.ts';

/**
 * What re-running one record needs, each piece checked against the record's hashes before
 * anything runs: the section's weights at that step; the forward's input (and, for a
 * backward, the gradient it was given); for a step, the gradients and AdamW's state it
 * stepped from. `output` is the worker's own result, for ort's tolerance.
 */
export interface Bundle {
  /** The model's config in Hugging Face form, and the section's global layer range. */
  config: Record<string, unknown>;
  range: [number, number];
  optimizer: { lr: number; weightDecay?: number };
  /** By name; a compact weight as the worker held it (`packedTensor`: its packed bytes and scales). */
  weights: Map<string, Tensor>;
  input?: Tensor;
  grad?: Tensor;
  output?: Tensor;
  grads?: Map<string, Tensor>;
  moments?: Map<string, { moments: Tensor; step: number }>;
  /** A backward's contribution to the gradients as the worker computed it (ort: compared within tolerance). */
  contribution?: Map<string, Tensor>;
  /** A decoding step: every step of its session up to it, in order (the KV cache is rebuilt from them). */
  history?: { input: Tensor; positions: Tensor; keyMask: Tensor | null }[];
  /** The hashes of those steps as the user sent them (`sessionStepHash`): the worker cannot swap its session's past. */
  sent?: string[];
  /** The job's LoRA adapter: the section is rebuilt with its factors (their values among `weights`), the base frozen. */
  adapter?: LoraConfig;
}

/**
 * A compact weight as a worker hands it over for an audit (the bytes of packedToBytes in a 'uint8' frame; its index entry
 * names the format and the weight's shape as a matrix), checked before it is held: a frozen weight in that format that
 * hashes as the worker's, or why not (a bad peer's frame is refused with a reason; nothing is held).
 * @example
 * compactWeightOf('int4', [64, 171], 'uint8', bytes) // a Tensor whose `packed` is the int4 matrix
 */
export function compactWeightOf(format: unknown, shape: unknown, dtype: string, bytes: Uint8Array): Tensor | string {
  if (typeof format !== 'string' || !(WEIGHT_FORMATS as readonly string[]).includes(format)) return `it named an unknown weight format '${String(format)}'`;
  const f = format as WeightFormat;
  if (!Array.isArray(shape) || shape.length !== 2 || !shape.every((d) => Number.isSafeInteger(d) && d > 0)) return `it named a ${f} weight of shape [${String(shape)}], not a matrix`;
  const [rows, cols] = shape as [number, number];
  const expected = formatBytes(f, rows, cols);
  if (dtype !== 'uint8' || bytes.byteLength !== expected) {
    return `it sent a [${rows}, ${cols}] ${f} weight as ${bytes.byteLength} ${dtype} bytes, not the ${expected} bytes of that shape`;
  }
  // a copy of exactly these bytes: aligned (the matrix is views over it), and no longer tied to the receive buffer
  return packedTensor(packedFromBytes(f, rows, cols, new Uint8Array(bytes)));
}

/** One decoding step as its record names it: the hash of its input and of its positions (and key mask), together. */
export function sessionStepHash(input: string, aux: string): string {
  return createHash('sha256').update(`${input}:${aux}`).digest('hex');
}

/** The hash of a step's positions and key mask, as a decoding record's `aux` names it. */
export function auxHash(positions: Tensor, keyMask: Tensor | null): string {
  return hashTensors(keyMask ? [positions, keyMask] : [positions]);
}

export interface Verdict {
  /** Whether the record is what re-running it gives. */
  ok: boolean;
  /** Re-running could not be done (a bad config, a bug): no evidence either way, and no score moves. */
  inconclusive?: boolean;
  /** Why not, for a person (and the evidence a slashing keeps). */
  reason: string;
  /** The output hash re-execution gave (bitwise on js). */
  output?: string;
}

const pass = (output?: string): Verdict => ({ ok: true, reason: 'reproduced', output });
const fail = (reason: string, output?: string): Verdict => ({ ok: false, reason, output });

/**
 * Re-runs a record (forward, backward, the optimizer step, or a decoding step) on the section
 * rebuilt from the bundle and compares: bit for bit for 'js' records, within the tolerance of the
 * weights' format for 'ort' (ortTolerance: float32, or the compact format the bundle's weights are
 * held in), against the worker's own output, which must hash as its record says. A bundle that
 * does not hash as the record says fails: the worker kept or sent something else.
 */
export function reexecute(record: WorkRecord, bundle: Bundle): Verdict {
  const backend = record.backend === 'js' ? 'js' : 'ort';
  const run = () => reexecuteOn(record, bundle, backend);
  try {
    return backend === 'js' ? withBackend('js', run) : run();
  } catch (err) {
    return { ok: false, inconclusive: true, reason: `re-execution could not run: ${(err as Error).message}` };
  }
}

function reexecuteOn(record: WorkRecord, bundle: Bundle, backend: 'js' | 'ort'): Verdict {
  const config = configFromHF(bundle.config);
  if (record.stage[0] !== bundle.range[0] || record.stage[1] !== bundle.range[1]) {
    throw new InvalidArgumentError(`the record is of layers [${record.stage}), the bundle of [${bundle.range}]`);
  }
  const stated = flopsProblem(record, config, bundle);
  if (stated) return fail(stated);
  const model = rebuildSection(config, bundle.range, bundle.weights, bundle.adapter);
  if (typeof model === 'string') return fail(model);
  const format = formatOfWeights(bundle.weights.values());
  if (record.kind === 'decode') return reexecuteDecode(record, bundle, model, backend, format);
  const captured: Map<string, Tensor>[] = [];
  // a step re-runs with the optimizer the worker's record names
  const optimizer = record.kind === 'step' ? { lr: record.lr ?? bundle.optimizer.lr, weightDecay: record.weightDecay } : bundle.optimizer;
  const executor = new StageExecutor(model.layers, config.maxPositions, {
    ...optimizer,
    onContribution: (_micro, c) => captured.push(new Map([...c].map(([n, t]) => [n, t.clone()]))),
  });
  if (weightsHash(executor) !== record.weights) return fail('the weights it kept are not the weights its record names');
  const compare = (mine: Tensor, theirs: string, what: string): Verdict | null => {
    const h = hashTensors([mine]);
    if (h === theirs) return null;
    if (backend === 'ort' && bundle.output && hashTensors([bundle.output]) === theirs) {
      if (agree('ort', mine.data as Float32Array, bundle.output.data as Float32Array, format)) return null;
    }
    return fail(`its ${what} is not what the computation gives`, h);
  };
  if (record.kind === 'forward' || record.kind === 'backward') {
    const input = bundle.input;
    if (!input) return fail('the bundle has no input');
    if (record.kind === 'forward') {
      if (hashTensors([input]) !== record.input) return fail('the input it kept is not the input its record names');
      const y = executor.forward(0, input);
      return compare(y, record.output, 'output') ?? pass(record.output);
    }
    if (record.from !== undefined && hashTensors([input]) !== record.from) return fail('the forward input it kept is not the one its record names');
    const grad = bundle.grad;
    if (!grad || hashTensors([grad]) !== record.input) return fail('the gradient it kept is not the one its record names');
    executor.forward(0, input);
    const gi = executor.backward(0, grad);
    const bad = gi ? compare(gi, record.output, 'input gradient') : record.output === '' ? null : fail('it names an input gradient of token ids');
    if (bad) return bad;
    const mine = captured[0] ?? new Map<string, Tensor>();
    const contribution = gradsHash(executor, mine);
    if (contribution === record.grads) return pass(record.output);
    // on ort: the worker's own contribution, hashing as its record says, within tolerance of ours
    const theirs = bundle.contribution;
    if (backend === 'ort' && theirs && gradsHash(executor, theirs) === record.grads) {
      const close = [...executor.named.keys()].every((n) => {
        const [a, b] = [mine.get(n), theirs.get(n)];
        return (!a && !b) || (a !== undefined && b !== undefined && agree('ort', a.data as Float32Array, b.data as Float32Array, format));
      });
      if (close) return pass(record.output);
    }
    return fail('its parameters\' gradients are not what the backward gives', contribution);
  }
  if (record.kind === 'step') {
    const { grads, moments } = bundle;
    if (!grads || !moments) return fail('the bundle has no optimizer state');
    for (const [n, s] of moments) executor.setMoments(n, s.moments, s.step);
    if (optimizerHash(executor) !== record.state) return fail('the optimizer state it kept is not the one its record names');
    if (gradsHash(executor, grads) !== record.input) return fail('the gradients it kept are not the ones its record names');
    // stepping scales the gradients in place: the bundle's own stay as they came
    executor.setGrads([...grads.keys()], [...grads.values()].map((g) => g.clone()));
    executor.step(record.scale ?? 1, record.lr ?? bundle.optimizer.lr);
    const w = weightsHash(executor);
    if (w !== record.output) return fail('the weights after its step are not what the step gives', w);
    const after = optimizerHash(executor);
    if (after !== record.after) return fail('its optimizer state after the step is not what the step gives', w);
    return pass(w);
  }
  return fail(`records of kind '${record.kind}' cannot be re-executed`);
}

/** The sha256 of a model's weights (and its adapter's) in checkpoint-name order, as decoding records name them. */
export function checkpointHash(model: CausalLM): string {
  return hashNamed([...weightsWithAdapter(model)].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)));
}

/**
 * The section of layers `range` of a model of `config` (with the job's adapter), holding `weights` as the worker held
 * them (loadWeights); or why it cannot hold them.
 */
export function rebuildSection(
  config: ModelConfig, range: [number, number], weights: Map<string, Tensor>, adapter?: LoraConfig,
): CausalLM | string {
  const model = createModel(config, { section: range });
  if (adapter) adaptModel(model, adapter, { part: true });
  return loadWeights(model, weights) ?? model;
}

/**
 * The bundle's weights into the rebuilt section: float32 ones copied, a compact one held as it came (packed, frozen),
 * so that the section computes with the very bytes the worker held and hashes as they do. Why it cannot (a compact
 * weight where the section has no matrix of its shape), or null.
 */
function loadWeights(model: CausalLM, weights: Map<string, Tensor>): string | null {
  model.loadStateDict(weights);
  const own = model.stateDict();
  for (const [name, src] of weights) {
    const target = own.get(name)!;
    if (!src.packed || target.packed === src.packed) continue; // a tied weight is held once
    try {
      holdPacked(target, src.packed);
    } catch (err) {
      return `its weight '${name}' cannot be held in ${src.packed.format}: ${(err as Error).message}`;
    }
  }
  return null;
}

function reexecuteDecode(record: WorkRecord, bundle: Bundle, model: CausalLM, backend: 'js' | 'ort', format: ComputeFormat): Verdict {
  if (checkpointHash(model) !== record.weights) return fail('the weights it kept are not the weights its record names');
  const history = bundle.history ?? [];
  if (history.length === 0) return fail('the bundle has no inputs');
  const stepHash = (h: (typeof history)[number]) => sessionStepHash(hashTensors([h.input]), auxHash(h.positions, h.keyMask));
  if (bundle.sent && (bundle.sent.length !== history.length || history.some((h, i) => stepHash(h) !== bundle.sent![i]))) {
    return fail('the inputs it kept are not the ones its session was sent');
  }
  const last = history.at(-1)!;
  if (hashTensors([last.input]) !== record.input) return fail('the input it kept is not the input its record names');
  if (record.aux !== undefined && auxHash(last.positions, last.keyMask) !== record.aux) {
    return fail('the positions it kept are not the ones its record names');
  }
  const session = () => {
    const cache = new KVCache(model.config.layers);
    let y: Tensor | null = null;
    for (const h of history) y = noGrad(() => model.forward(h.input, { cache, positions: h.positions, keyMask: h.keyMask }));
    return y!;
  };
  const y = session();
  const h = hashTensors([y]);
  if (h === record.output) return pass(h);
  const theirs = bundle.output;
  if (backend === 'ort' && theirs && hashTensors([theirs]) === record.output) {
    // an int8/int4 section is compared on what it added to its input (when the input is hidden states of its size)
    const base = last.input.dtype === 'float32' ? (last.input.data as Float32Array) : undefined;
    const out = theirs.data as Float32Array;
    if (agree('ort', y.data as Float32Array, out, format, base)) return pass(record.output);
    // the other honest path: a CPU whose MatMulNBits has no int8 kernels computes in float32, as the exact js kernels do
    if ((format === 'int8' || format === 'int4') && getBackend().name !== 'js') {
      const exact = withBackend('js', session);
      if (agree('ort', exact.data as Float32Array, out, 'f32')) return pass(record.output);
    }
  }
  return fail('its output is not what the computation gives', h);
}

/**
 * The most bytes a bundle for a record of `range` may hold: its weights, AdamW's two moments
 * and the gradients (a step), a session's inputs and outputs up to the model's context, and
 * room for activations. A worker that sends more is refused before the validator holds it.
 */
export function maxBundleBytes(hfConfig: Record<string, unknown>, range: [number, number]): number {
  const config = configFromHF(hfConfig);
  const weights = partBytes(config, range);
  const perToken = 4 * Math.max(config.hidden, config.vocabSize);
  return 5 * weights + 4 * config.maxPositions * perToken * 64 + 64 * 2 ** 20;
}

/** Why the FLOPs a record states are not its computation's (null: they are, or it states none): the ledger pays for them. */
function flopsProblem(record: WorkRecord, config: ModelConfig, bundle: Bundle): string | null {
  if (record.flops === undefined) return null;
  const input = record.kind === 'decode' ? bundle.history?.at(-1)?.input : bundle.input;
  const tokens = input ? input.shape[0] * (input.shape[1] ?? 1) : 0;
  const expected = Math.round(recordFlops(record.kind, sectionCost(config, record.stage), tokens));
  return record.flops === expected ? null : `it states ${record.flops} FLOPs; the computation it kept takes ${expected}`;
}
