import { createModel, deviceStepModel, generate, generateWith, gpt2Config, KVCache, llamaConfig } from '../src/models/index.ts';
import { createOrtBackend, jsBackend, noGrad, randint, setBackend, type Tensor, tensor, trace, withBackend } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import { time } from './models.ts';

/**
 * Whole steps as one graph on the CPU (#46): a step traced once and run as one ONNX graph on
 * onnxruntime's CPU provider (ort's compileStep) against the same step op by op on ort (its
 * native kernels with js between them), at the same thread count, in the same run:
 * - GPT-2 124M's forward on 1×128 tokens;
 * - a decoding step of a Llama of ~100M (12 blocks, hidden 768, grouped-query) after 128 cached
 *   tokens, its KV cache an input and output of the step, against ort's own decoding path (the
 *   fused decoding step on its buffers, the fastest op-by-op path).
 * - the same Llama generating 64 tokens after a prompt of 64, each decoding step one graph on a
 *   bounded cache (DeviceRunner on the CPU: one graph for every position), against `generate` on
 *   ort (the fused decoding step), in tokens/s.
 * A ratio below 1 is the graph being faster (above 1 for tokens/s).
 */
export async function benchGraph(threads: number[], runs = 5): Promise<Row[]> {
  const rows: Row[] = [];
  const gpt2 = createModel(gpt2Config(), { seed: 0 });
  const ids = randint(0, 50257, [1, 128], { seed: 1 });
  const forward = withBackend(jsBackend, () => noGrad(() => trace((x: Tensor) => gpt2.forward(x), [ids]))).step;

  const config = llamaConfig({ vocabSize: 32000, hidden: 768, layers: 12, heads: 12, kvHeads: 4, intermediate: 2048, maxPositions: 512 });
  const llama = createModel(config, { seed: 0 });
  const prompt = randint(0, 32000, [1, 128], { seed: 2 });
  const prefilled = new KVCache(llama.config.layers);
  withBackend(jsBackend, () => noGrad(() => llama.forward(prompt, { cache: prefilled })));
  const past = prefilled.layers.flatMap((e) => [e!.k, e!.v]).map((t) => tensor(Float32Array.from(t.data), [...t.shape]));
  const token = tensor([7], [1, 1], 'int32');
  const decode = (x: Tensor, ...kv: Tensor[]) => {
    const cache = new KVCache(llama.config.layers);
    for (let i = 0; i < llama.config.layers; i++) cache.layers[i] = { k: kv[2 * i], v: kv[2 * i + 1] };
    return [llama.forward(x, { cache }), ...cache.layers.flatMap((e) => [e!.k, e!.v])];
  };
  const decodeStep = withBackend(jsBackend, () => noGrad(() => trace(decode, [token, ...past]))).step;

  for (const t of threads) {
    const label = `${t} thread${t > 1 ? 's' : ''}`;
    const compiled = createOrtBackend({ threads: t });
    const opByOp = createOrtBackend({ threads: t, compileSteps: false });
    const graphForward = time(() => withBackend(compiled, () => noGrad(() => forward.run([ids]))), runs);
    const plainForward = time(() => withBackend(opByOp, () => noGrad(() => gpt2.forward(ids))), runs);
    rows.push({
      section: 'graph', case: `GPT-2 124M forward 1×128 as one graph, ${label}`, value: graphForward, unit: 'ms',
      reference: 'ort op by op', referenceValue: plainForward, ratio: graphForward / plainForward, target: '< 1',
    });
    const graphDecode = time(() => withBackend(compiled, () => noGrad(() => decodeStep.run([token, ...past]))), runs);
    const plainDecode = time(() => withBackend(opByOp, () => noGrad(() => {
      const cache = new KVCache(llama.config.layers);
      for (let i = 0; i < llama.config.layers; i++) cache.layers[i] = { k: past[2 * i], v: past[2 * i + 1] };
      llama.forward(token, { cache });
    })), runs);
    rows.push({
      section: 'graph', case: `Llama ~100M decoding step (128 cached) as one graph, ${label}`, value: graphDecode, unit: 'ms',
      reference: 'ort op by op (fused decoding step)', referenceValue: plainDecode, ratio: graphDecode / plainDecode, target: '< 1',
    });
  }
  const prompt64 = Array.from(randint(0, 32000, [64], { seed: 3 }).data);
  for (const t of threads) {
    const label = `${t} thread${t > 1 ? 's' : ''}`;
    const tokensPerSecond = async (run: () => Promise<unknown>) => {
      await run();
      const t0 = performance.now();
      await run();
      return 64 / ((performance.now() - t0) / 1000);
    };
    const options = { maxNewTokens: 64, temperature: 0, stopTokens: [] };
    setBackend(createOrtBackend({ threads: t }));
    const graph = await tokensPerSecond(() => generateWith(deviceStepModel(llama, 'cpu'), [prompt64], options));
    setBackend(createOrtBackend({ threads: t, compileSteps: false }));
    const plain = await tokensPerSecond(() => generate(llama, prompt64, options));
    rows.push({
      section: 'graph', case: `Llama ~100M generation, 64 + 64 tokens, each step one graph (bounded cache), ${label}`, value: graph, unit: 'tok/s',
      reference: 'generate on ort (fused decoding step)', referenceValue: plain, ratio: graph / plain, target: '> 1',
    });
  }
  return rows;
}
