/**
 * llama.cpp (node-llama-cpp, from bench/llama-cpp) on the CPU for the benches' children: a model's sequence with a
 * context of at least `seqLen` positions, and the −log p(target) of held-out windows from its full next-token
 * distribution, each window from an empty cache, as ours scores them.
 */

type Scored = [number, { generateNext?: { probabilities?: boolean } }];

/** What the benches use of a node-llama-cpp context sequence. */
export interface LlamaSequence {
  evaluate(tokens: number[], options: { temperature: number }): AsyncGenerator<number>;
  controlledEvaluate(input: Scored[]): Promise<({ next?: { probabilities?: Map<number, number> } } | undefined)[]>;
  clearHistory(): Promise<void>;
}

/** Loads a GGUF file on the CPU with `threads` threads and returns its sequence. */
export async function openLlamaCpp(module: string, file: string, threads: number, seqLen: number): Promise<LlamaSequence> {
  const { getLlama } = (await import(module)) as {
    getLlama(o: object): Promise<{
      loadModel(o: object): Promise<{ createContext(o: object): Promise<{ getSequence(): LlamaSequence }> }>;
    }>;
  };
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: 'error', maxThreads: threads });
  const model = await llama.loadModel({ modelPath: file, gpuLayers: 0 });
  const context = await model.createContext({
    contextSize: Math.max(256, seqLen), batchSize: Math.max(256, seqLen), threads: { ideal: threads, min: threads },
  });
  return context.getSequence();
}

/** The summed −log p(target) of each of the first `windows` windows of `seqLen` tokens of `data` (targets: the next token). */
export async function windowLosses(sequence: LlamaSequence, data: ArrayLike<number>, seqLen: number, windows: number): Promise<number[]> {
  const losses: number[] = [];
  const available = Math.min(windows, Math.floor((data.length - 1) / seqLen));
  for (let w = 0; w < available; w++) {
    await sequence.clearHistory();
    const items = Array.from({ length: seqLen }, (_, i): Scored => [data[w * seqLen + i], { generateNext: { probabilities: true } }]);
    const out = await sequence.controlledEvaluate(items);
    let total = 0;
    for (let i = 0; i < seqLen; i++) total -= Math.log(Math.max(out[i]?.next?.probabilities?.get(data[w * seqLen + i + 1]) ?? 0, 1e-30));
    losses.push(total);
  }
  return losses;
}
