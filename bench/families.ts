import { type CausalLM, createModel, gemmaConfig, KVCache, llamaConfig, mixtralConfig } from '../src/models/index.ts';
import { createOrtBackend, noGrad, randint, setBackend, type Tensor, tensor } from '../src/tensor/index.ts';
import type { Row } from './gemm.ts';
import { timeBlocks } from './timing.ts';

/**
 * The families against the dense model a user would compare them with: one decoded token (KV
 * cache, a fixed context) of a Gemma 2 against a Llama of the same shape, and of a Mixtral against
 * a dense Llama with as many parameters as the Mixtral runs per token (its top-k experts). All
 * random weights at small shapes, on the ort backend.
 */

/** Tokens in the cache before each decoded token. */
const CACHED = 128;

/** What the three models share: width, heads (grouped 2:1), blocks, vocabulary. */
const SHAPE = { vocabSize: 8192, hidden: 512, heads: 8, kvHeads: 4, headDim: 64, layers: 4, maxPositions: 1024 };

/** Mixtral's experts: 8 of 768 wide, 2 run per token, so its active MLP is one SwiGLU of 2 × 768. */
const MOE = { experts: 8, topK: 2, width: 768 };

/**
 * A decoding step after a CACHED-token prompt: each call decodes the same token at position
 * CACHED on a copy of the prompt's cache (cached entries are replaced, never written into), so
 * every call attends over the same context.
 */
function decodeStep(model: CausalLM, prompt: Tensor): () => number {
  const prefilled = new KVCache(model.config.layers);
  noGrad(() => model.forward(prompt, { cache: prefilled }));
  const next = tensor([1], [1, 1], 'int32');
  return () => {
    const cache = new KVCache(model.config.layers);
    prefilled.layers.forEach((entry, i) => (cache.layers[i] = entry));
    return noGrad(() => model.forward(next, { cache })).argmax(-1).data[0];
  };
}

const millions = (n: number) => `${(n / 1e6).toFixed(1)}M`;

/**
 * Per-token decode time of a Gemma 2 and of a Mixtral, each against its dense Llama measured in
 * the same run (in blocks, best of three rounds), at each thread count.
 */
export async function benchFamilies(threads: number[]): Promise<Row[]> {
  // a dense Llama: the same shape as the Gemma, and as many parameters as the Mixtral runs
  const llama = createModel(llamaConfig({ ...SHAPE, intermediate: MOE.topK * MOE.width, tieWordEmbeddings: false }), { seed: 0 });
  const gemma = createModel(
    gemmaConfig({ ...SHAPE, modelType: 'gemma2', intermediate: MOE.topK * MOE.width, tieWordEmbeddings: false }),
    { seed: 0 },
  );
  const mixtral = createModel(
    mixtralConfig({ ...SHAPE, intermediate: MOE.width, experts: MOE.experts, topK: MOE.topK, tieWordEmbeddings: false }),
    { seed: 0 },
  );
  const idle = SHAPE.layers * (MOE.experts - MOE.topK) * 3 * SHAPE.hidden * MOE.width; // experts a token skips
  const active = mixtral.numParameters() - idle;
  const prompt = randint(0, SHAPE.vocabSize, [1, CACHED], { seed: 1 });
  const shape = `${SHAPE.hidden} wide, ${SHAPE.layers} blocks`;

  const rows: Row[] = [];
  for (const t of threads) {
    setBackend(createOrtBackend({ threads: t }));
    const label = `${t} thread${t > 1 ? 's' : ''}`;
    const dense = decodeStep(llama, prompt);
    const [gemmaMs, llamaForGemmaMs] = await timeBlocks(decodeStep(gemma, prompt), dense);
    rows.push({
      section: 'families',
      case: `Gemma 2 decode 1 token (KV cache, ${CACHED} cached), ${shape}, ${millions(gemma.numParameters())}, ${label}`,
      value: gemmaMs,
      unit: 'ms',
      reference: `Llama, same shape, ${millions(llama.numParameters())}`,
      referenceValue: llamaForGemmaMs,
      ratio: gemmaMs / llamaForGemmaMs,
    });
    const [mixtralMs, llamaForMixtralMs] = await timeBlocks(decodeStep(mixtral, prompt), dense);
    rows.push({
      section: 'families',
      case: `Mixtral decode 1 token (KV cache, ${CACHED} cached), ${shape}, ${MOE.experts} experts × ${MOE.width}, top-${MOE.topK}: `
        + `${millions(active)} active of ${millions(mixtral.numParameters())}, ${label}`,
      value: mixtralMs,
      unit: 'ms',
      reference: `dense Llama, ${millions(llama.numParameters())} (MLP ${MOE.topK * MOE.width})`,
      referenceValue: llamaForMixtralMs,
      ratio: mixtralMs / llamaForMixtralMs,
    });
  }
  return rows;
}
