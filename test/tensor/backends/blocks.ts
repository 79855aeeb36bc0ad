/**
 * The model blocks of the conformance suite (suite.ts): block 0 of each family's fixture (test/fixtures/hf/<family>/),
 * run on a backend as training runs it (forward and backward), as decoding runs it (a KV cache, no gradients), and as
 * a traced step (src/tensor/trace.ts) traced on js and replayed with new inputs on the backend.
 */
import { join } from 'node:path';
import { type CausalLM, KVCache, loadModel } from '../../../src/models/index.ts';
import { type Backend, backendDevice, Generator, jsBackend, noGrad, randn, type Tensor, trace, withBackend } from '../../../src/tensor/index.ts';
import type { ComputeFormat } from '../../../src/verify/index.ts';
import { HF_FIXTURES, hfFixtureNames } from '../../helpers/hf-fixtures.ts';
import type { Result } from './compare.ts';

/** The seed of every block's inputs. */
const SEED = 45;

/** Rows [2, 32] of hidden states: 64 rows through a 64-wide block's products (262k MACs), 2·4·32·32 = 8192 scores. */
const BLOCK_INPUT = [2, 32] as const;

/** [fixture, the format its weights are held in]: each family in float32; Llama also in each compact format. */
export const BLOCKS: readonly (readonly [string, ComputeFormat])[] = [
  ...hfFixtureNames().map((name) => [name, 'f32'] as const),
  ['llama', 'bf16'],
  ['llama', 'int8'],
  ['llama', 'int4'],
];

const loadOptions = (format: ComputeFormat) => (format === 'f32' ? {} : format === 'bf16' ? { dtype: 'bf16' as const } : { quantize: format });

/**
 * Block 0 of a fixture, its weights in `format`: a section [1, 2) of the model, which takes hidden states.
 * @example
 * const block = await loadBlock('llama', 'int8')
 */
export function loadBlock(fixture: string, format: ComputeFormat): Promise<CausalLM> {
  return loadModel(join(HF_FIXTURES, fixture), { part: [1, 2], ...loadOptions(format) });
}

/** A block's results, and its inputs under the labels of the outputs they gave (what int8 and int4 are compared on). */
export interface BlockRun {
  results: Result[];
  inputs: Result[];
}

/** One block's forward and backward: its output, its input's gradient, each parameter's gradient by name. */
export function trainBlock(backend: Backend, block: CausalLM): BlockRun {
  return withBackend(backend, () => {
    const params = [...block.hfStateDict()];
    for (const [, p] of params) p.grad = null;
    const x = randn([...BLOCK_INPUT, block.config.hidden], { generator: new Generator(SEED) });
    x.requiresGrad = true;
    const y = block.forward(x);
    y.mul(randn(y.shape, { seed: 1000 })).sum().backward();
    const results: Result[] = [{ label: 'output', values: y.data }, { label: 'gradient of the input', values: x.grad!.data }];
    for (const [name, p] of params) if (p.grad) results.push({ label: `gradient of ${name}`, values: p.grad.data });
    return { results, inputs: [{ label: 'output', values: x.data }] };
  });
}

/** Decoding steps after a prompt of 24 (2·4·24·24·16 = 73k MACs of attention over the cache). */
const PROMPT = 24;
const STEPS = 3;

/**
 * One block as decoding runs it, with a KV cache and no gradients: a prompt's hidden states, then one token at a time
 * (attention over the cache time-major; Llama-like blocks take the fused decoding step where the backend has one).
 */
export function decodeBlock(backend: Backend, block: CausalLM): BlockRun {
  return withBackend(backend, () => noGrad(() => {
    const g = new Generator(SEED);
    const cache = new KVCache(block.config.layers);
    const run: BlockRun = { results: [], inputs: [] };
    for (let step = 0; step <= STEPS; step++) {
      const label = step === 0 ? 'the prompt\'s output' : `step ${step}'s output`;
      const x = randn([1, step === 0 ? PROMPT : 1, block.config.hidden], { generator: g });
      run.results.push({ label, values: block.forward(x, { cache }).data });
      run.inputs.push({ label, values: x.data });
    }
    return run;
  }));
}

/** The inputs of a traced step, and what they are called in results. */
interface StepInputs {
  tensors: Tensor[];
  label: string;
}

/**
 * A traced step of a block: `fn` traced once on js (with the first of `inputs`), then replayed on `backend` with each
 * of the others (`step.run`: op by op, or as one program where the backend compiles steps), beside `fn` called on js
 * with the same inputs, the reference. Returns the reference's results and the replays', under the same labels (a
 * step that returns several tensors: each under its label and `names`' name for it).
 */
async function tracedRuns(
  backend: Backend, fn: (...xs: Tensor[]) => Tensor | Tensor[], inputs: StepInputs[], names: readonly string[] = [],
): Promise<{ ref: BlockRun; got: BlockRun }> {
  const { step } = noGrad(() => withBackend(jsBackend, () => trace(fn, inputs[0].tensors)));
  const ref: BlockRun = { results: [], inputs: [] };
  const got: BlockRun = { results: [], inputs: [] };
  const outputs = async (out: Tensor | Tensor[], label: string): Promise<Result[]> =>
    Promise.all((Array.isArray(out) ? out : [out]).map(async (t, i) => ({ label: i === 0 ? label : `${label}: ${names[i - 1]}`, values: await t.read() })));
  const device = backendDevice(backend);
  for (const { tensors, label } of inputs.slice(1)) {
    const expected = noGrad(() => withBackend(jsBackend, () => fn(...tensors)));
    // on a device backend the step runs where its inputs live (compiled there by the backend), and is read back after
    const replayed = noGrad(() => (device === 'cpu' ? withBackend(backend, () => step.run(tensors)) : step.run(tensors.map((t) => t.to(device)))));
    ref.results.push(...await outputs(expected, label));
    got.results.push(...await outputs(replayed, label));
    for (const run of [ref, got]) run.inputs.push({ label, values: tensors[0].data });
  }
  return { ref, got };
}

/** Hidden states [...rows, hidden] drawn from `g` (rows [2, 32] unless given). */
const hidden = (g: Generator, block: CausalLM, rows: readonly number[] = BLOCK_INPUT): Tensor =>
  randn([...rows, block.config.hidden], { generator: g });

/** How many inputs a traced step is replayed with (after the one it is traced with). */
const REPLAYS = 2;

/**
 * A block's forward without gradients (the fused products and the backend's kernels), traced on js and replayed on
 * `backend` with new hidden states.
 */
export function tracedForward(backend: Backend, block: CausalLM): Promise<{ ref: BlockRun; got: BlockRun }> {
  const g = new Generator(SEED);
  const inputs = Array.from({ length: REPLAYS + 1 }, (_, i) => ({ tensors: [hidden(g, block)], label: `replay ${i}'s output` }));
  return tracedRuns(backend, (x) => block.forward(x), inputs);
}

/**
 * A decoding step of a block with its KV cache as inputs and outputs: one token's hidden states and the keys and values
 * of a prompt of PROMPT tokens ([1, kvHeads, PROMPT, headDim], the block's cache after that prompt on js) in, the
 * token's output and the cache grown by it out, without gradients (as decoding runs). Traced on js, replayed on
 * `backend` with another token and another prompt's cache. While a trace records, the block keeps its cache as tensors
 * joined by ops and skips the fused step (src/models/forward.ts, decode-step.ts), so a replay grows the cache it is
 * given; the reference, called directly, appends in place (and takes the fused step where the backend has one).
 */
export function tracedDecodingStep(backend: Backend, block: CausalLM): Promise<{ ref: BlockRun; got: BlockRun }> {
  const g = new Generator(SEED + 1);
  // a prompt's keys and values on js: the cache a decoding step reads
  const prompted = (): { k: Tensor; v: Tensor; index: number } => withBackend(jsBackend, () => noGrad(() => {
    const cache = new KVCache(block.config.layers);
    block.forward(hidden(g, block, [1, PROMPT]), { cache });
    const index = cache.layers.findIndex((e) => e !== null);
    const entry = cache.layers[index]!;
    return { k: entry.k, v: entry.v, index };
  }));
  const inputs = Array.from({ length: REPLAYS + 1 }, (_, i) => {
    const { k, v } = prompted();
    return { tensors: [hidden(g, block, [1, 1]), k, v], label: `step ${i}'s output` };
  });
  const { index } = prompted();
  const decode = (x: Tensor, k: Tensor, v: Tensor): Tensor[] => {
    const cache = new KVCache(block.config.layers);
    cache.layers[index] = { k, v };
    const y = block.forward(x, { cache });
    const grown = cache.layers[index]!;
    return [y, grown.k, grown.v];
  };
  return tracedRuns(backend, decode, inputs, ['the cache\'s keys', 'the cache\'s values']);
}

/**
 * A block's training step as a traced step: forward, and backward of Σ output · w (w seeded, a constant of the step),
 * traced on js and replayed on `backend` with new hidden states (op by op, or as one graph of forward and backward
 * where the backend compiles steps: graph/step-backward.ts), beside the same step called on js. Compared: the output
 * and every parameter's gradient, which the step adds into `.grad` (cleared before each run). Float32 blocks only: a
 * compact weight is frozen, and a gradient through it is not lowered.
 */
export async function tracedTraining(backend: Backend, block: CausalLM): Promise<{ ref: BlockRun; got: BlockRun }> {
  const g = new Generator(SEED + 2);
  const params = [...block.hfStateDict()].filter(([, p]) => p.requiresGrad);
  const clear = () => params.forEach(([, p]) => (p.grad = null));
  const weights = withBackend(jsBackend, () => randn([...BLOCK_INPUT, block.config.hidden], { seed: 1000 }));
  const stepFn = (x: Tensor): Tensor => {
    const y = block.forward(x);
    y.mul(weights).sum().backward();
    return y;
  };
  const { step } = withBackend(jsBackend, () => trace(stepFn, [hidden(g, block)]));
  const device = backendDevice(backend);
  const ref: BlockRun = { results: [], inputs: [] };
  const got: BlockRun = { results: [], inputs: [] };
  const collect = async (run: BlockRun, y: Tensor, label: string) => {
    run.results.push({ label, values: await y.read() });
    for (const [name, p] of params) if (p.grad) run.results.push({ label: `${label}: gradient of ${name}`, values: await p.grad.read() });
    run.inputs.push({ label, values: new Float32Array(0) });
  };
  for (let i = 1; i <= REPLAYS; i++) {
    const x = hidden(g, block);
    const label = `replay ${i}'s output`;
    clear();
    await collect(ref, withBackend(jsBackend, () => stepFn(x)), label);
    clear();
    const y = device === 'cpu' ? withBackend(backend, () => step.run([x])) : step.run([x.to(device)]);
    await collect(got, y, label);
  }
  clear();
  return { ref, got };
}
