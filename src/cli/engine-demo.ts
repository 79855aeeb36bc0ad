import { AdamW, cosineWithWarmup, Embedding, Linear, LRScheduler, Module } from '../nn/index.ts';
import { crossEntropy, Generator, getBackend, noGrad, type Tensor, tensor } from '../tensor/index.ts';

/**
 * The single-process showcase of the engine (until the distributed demo exists): a small
 * network learns to add two 2-digit numbers digit by digit, trained with autograd and
 * AdamW under a warm-up + cosine schedule, and is scored on sums it never saw.
 */

const DIGITS_IN = 4; // a = d0 d1, b = d2 d3
const DIGITS_OUT = 3; // sum = s0 s1 s2 (up to 198)

class Adder extends Module {
  readonly embed: Embedding;
  readonly fc1: Linear;
  readonly fc2: Linear;
  readonly out: Linear;
  constructor(rng: Generator, dim = 32, hidden = 256) {
    super();
    this.embed = this.addModule('embed', new Embedding(10 * DIGITS_IN, dim, { rng, std: 0.5 }));
    this.fc1 = this.addModule('fc1', new Linear(DIGITS_IN * dim, hidden, { rng }));
    this.fc2 = this.addModule('fc2', new Linear(hidden, hidden, { rng }));
    this.out = this.addModule('out', new Linear(hidden, DIGITS_OUT * 10, { rng }));
  }

  /** ids [B, 4] (digit + 10·position) → logits [B, 3, 10] */
  forward(ids: Tensor): Tensor {
    const b = ids.shape[0];
    const x = this.embed.forward(ids).reshape([b, -1]); // [B, 4·dim]
    const h = this.fc2.forward(this.fc1.forward(x).gelu()).gelu();
    return this.out.forward(h).reshape([b, DIGITS_OUT, 10]);
  }
}

function encode(pairs: [number, number][]): { ids: Tensor; targets: Tensor } {
  const ids: number[] = [];
  const targets: number[] = [];
  for (const [a, b] of pairs) {
    const digits = [Math.floor(a / 10), a % 10, Math.floor(b / 10), b % 10];
    digits.forEach((d, pos) => ids.push(d + 10 * pos));
    const s = a + b;
    targets.push(Math.floor(s / 100), Math.floor(s / 10) % 10, s % 10);
  }
  return {
    ids: tensor(ids, [pairs.length, DIGITS_IN], 'int32'),
    targets: tensor(targets, [pairs.length, DIGITS_OUT], 'int32'),
  };
}

export interface EngineDemoOptions {
  steps: number;
  batch: number;
  seed: number;
  onProgress?: (step: number, loss: number, lr: number) => void;
}

export interface EngineDemoResult {
  accuracy: number;
  heldOut: number;
  trainPairs: number;
  steps: number;
  finalLoss: number;
  parameters: number;
  backend: string;
  seconds: number;
  examples: { question: string; answer: number; predicted: number }[];
}

function predict(model: Adder, pairs: [number, number][]): number[] {
  return noGrad(() => {
    const logits = model.forward(encode(pairs).ids);
    const digits = logits.argmax(-1).data;
    return pairs.map((_, i) => 100 * digits[3 * i] + 10 * digits[3 * i + 1] + digits[3 * i + 2]);
  });
}

export function runEngineDemo(options: EngineDemoOptions): EngineDemoResult {
  const started = performance.now();
  const rng = new Generator(options.seed);
  const all: [number, number][] = [];
  for (let a = 0; a < 100; a++) for (let b = 0; b < 100; b++) all.push([a, b]);
  rng.shuffle(all);
  const test = all.slice(0, 2000);
  const train = all.slice(2000);
  const model = new Adder(rng);
  const opt = new AdamW(model.parameters(), { lr: 3e-3, weightDecay: 0.01 });
  const schedule = new LRScheduler(
    opt,
    cosineWithWarmup({ warmupSteps: 50, totalSteps: options.steps, minRatio: 0.05 }),
  );
  let finalLoss = Number.NaN;
  for (let step = 0; step < options.steps; step++) {
    const batch = Array.from({ length: options.batch }, () => train[rng.int(train.length)]);
    const { ids, targets } = encode(batch);
    const loss = crossEntropy(model.forward(ids), targets);
    loss.backward();
    opt.step();
    opt.zeroGrad();
    schedule.step();
    finalLoss = loss.item();
    options.onProgress?.(step + 1, finalLoss, opt.lr);
  }
  const predicted = predict(model, test);
  const correct = predicted.filter((p, i) => p === test[i][0] + test[i][1]).length;
  return {
    accuracy: correct / test.length,
    heldOut: test.length,
    trainPairs: train.length,
    steps: options.steps,
    finalLoss,
    parameters: model.numParameters(),
    backend: getBackend().name,
    seconds: (performance.now() - started) / 1000,
    examples: test
      .slice(0, 6)
      .map(([a, b], i) => ({ question: `${a}+${b}`, answer: a + b, predicted: predicted[i] })),
  };
}
