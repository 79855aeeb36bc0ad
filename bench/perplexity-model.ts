/**
 * The trained model the perplexity section measures: a small Llama (byte-level vocabulary, the quant section's
 * tokenizer) trained on Debian's fortunes until its greedy text is words, then exported to GGUF at F32, BF16, Q8_0 and
 * Q4_0. Made once and cached under bench/out/perplexity/ (outside git: bench/out/ is ignored); a later run with the
 * same settings reuses it, and the stamp says how long making it took.
 *
 *   node --import tsx bench/perplexity-model.ts     # makes it (or says it is there), prints the steps, loss and sample
 *
 * Why not the quant section's ~100M shape: one of its steps (8 × 64 tokens) takes ~5.5 s on this 2-core VM, so the
 * thousands of steps words take would be hours; this shape (4 blocks 256 wide, 3.2M parameters) takes ~1.4 s a step of
 * 16 × 128 bytes on an idle VM (2-3 s on a loaded one). See STAGES for the steps.
 */
import '../src/polyfills.ts';
import { existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { fortunesDataset, heldOutLoss, textBatch } from '../src/data/index.ts';
import {
  byteLevelTokenizerJson, type CausalLM, configToHF, createModel, hfToGGUF, HFTokenizer, KVCache, llamaConfig, loadModel, LocalTrainer,
} from '../src/models/index.ts';
import { createOrtBackend, Generator, noGrad, setBackend, tensor } from '../src/tensor/index.ts';

/** 4 blocks 256 wide (4 heads of 64, 2 KV heads), SwiGLU 768, byte-level vocabulary, tied head: 3.2M parameters. */
export const CONFIG = llamaConfig({
  vocabSize: 257, hidden: 256, heads: 4, kvHeads: 2, layers: 4, intermediate: 768, maxPositions: 512,
  tieWordEmbeddings: true, bosTokenId: 256, eosTokenId: 256,
});
const SEED = 7;
/** A stage of training: steps of `batch` × SEQ fortune bytes, learning rate warmed up then cosine down to 10%. */
export interface Stage {
  steps: number;
  batch: number;
  lr: number;
  warmup: number;
}
/**
 * Stage 1 (800 steps of 16 × 128, ~35 min on this loaded VM) left the greedy text half words ("the stard the stard ...",
 * held-out perplexity 6.9); stage 2 continues from its weights with smaller batches (more updates for the time), which
 * left it at 78% words ("the seen the stard the seen ...", 6.3); stage 3 continues at a lower rate: 94% words ("the
 * start of the start of ...", held-out perplexity 5.9 on the first 8,192 bytes). 2,300 steps in all: ~1 h on this VM.
 */
export const STAGES: readonly Stage[] = [
  { steps: 800, batch: 16, lr: 2e-3, warmup: 30 },
  { steps: 700, batch: 8, lr: 1e-3, warmup: 20 },
  { steps: 800, batch: 8, lr: 8e-4, warmup: 20 },
];
const SEQ = 128;
/** The greedy sample: this prompt, then SAMPLE_TOKENS bytes. */
export const PROMPT = 'The best thing about ';
const SAMPLE_TOKENS = 160;
/** Held-out loss after training: the first windows of the held-out fortunes (the section scores them all, per format). */
const CHECK_WINDOWS = 64;

/** The GGUF exports: our name of the format, llama.cpp's, and hfToGGUF's type. */
export const FORMATS = [
  { ours: 'f32', gguf: 'F32', type: 'f32' },
  { ours: 'bf16', gguf: 'BF16', type: 'bf16' },
  { ours: 'int8', gguf: 'Q8_0', type: 'q8_0' },
  { ours: 'int4', gguf: 'Q4_0', type: 'q4_0' },
] as const;
export type Format = (typeof FORMATS)[number]['ours'];

/** What making the model gave (the stamp's content, with the files' paths). */
export interface TrainedModel {
  files: Record<Format, string>;
  params: number;
  steps: number;
  batch: number;
  seq: number;
  /** Seconds the training took, and the whole making (training, check, sample, exports). */
  trainSeconds: number;
  makeSeconds: number;
  /** The first step's train loss, and the mean of the last 50 steps'. */
  firstLoss: number;
  lastLoss: number;
  /** Held-out perplexity in float32 right after training (CHECK_WINDOWS windows of SEQ), and the greedy sample. */
  heldOut: { loss: number; perplexity: number; tokens: number };
  sample: string;
  /** Of the sample's words (runs of 2+ letters), the share that occur in the training text. */
  wordShare: number;
  /** When it was made. */
  made: string;
  /** The stages it was trained in, with the seconds each took (a stamp made before stages were recorded: stage 1's from its total). */
  stages?: (Stage & { seconds: number })[];
}

const OUT = fileURLToPath(new URL('./out/perplexity/', import.meta.url));
const log = (s: string) => process.stderr.write(`${s}\n`);

export const tokenizer = (): HFTokenizer => new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);

/** Greedy bytes after `prompt`, one at a time on the KV cache. */
export function greedy(model: CausalLM, prompt: number[], count: number): number[] {
  const cache = new KVCache(model.config.layers);
  const out: number[] = [];
  let ids = prompt;
  while (out.length < count) {
    const next = noGrad(() => {
      const logits = model.forward(tensor(Int32Array.from(ids), [1, ids.length], 'int32'), { cache });
      const v = logits.shape[2];
      const last = logits.data.subarray((ids.length - 1) * v, ids.length * v) as Float32Array;
      let best = 0;
      for (let i = 1; i < v; i++) if (last[i] > last[best]) best = i;
      return best;
    });
    out.push(next);
    ids = [next];
  }
  return out;
}

/** Of the words (runs of 2+ ASCII letters, lower-cased) in `text`, the share found in `known`. */
export function wordShare(text: string, known: ReadonlySet<string>): number {
  const words = text.toLowerCase().match(/[a-z]{2,}/g) ?? [];
  return words.length === 0 ? 0 : words.filter((w) => known.has(w)).length / words.length;
}

/**
 * Trains and exports the model, or returns the one made earlier with the same settings: stage by stage (STAGES), each
 * cached in its own folder and started from the previous stage's F32 export (a fresh optimizer and schedule).
 */
export async function trainedModel(): Promise<TrainedModel> {
  let previous: Stamped | null = null;
  for (const [i, stage] of STAGES.entries()) previous = await trainStage(i, stage, previous);
  return previous!;
}

type Stamped = TrainedModel & { key: string };

async function trainStage(index: number, stage: Stage, previous: Stamped | null): Promise<Stamped> {
  const steps = (previous?.steps ?? 0) + stage.steps;
  const dir = `${OUT}llama-${CONFIG.layers}x${CONFIG.hidden}-${steps}-steps/`;
  const stamp = `${dir}made.json`;
  const files = Object.fromEntries(FORMATS.map((f) => [f.ours, `${dir}model-${f.type}.gguf`])) as Record<Format, string>;
  const key = JSON.stringify({
    CONFIG, SEED, TRAIN_STEPS: stage.steps, BATCH: stage.batch, SEQ, LR: stage.lr, WARMUP: stage.warmup,
    PROMPT, SAMPLE_TOKENS, CHECK_WINDOWS,
    ...(previous ? { after: previous.key } : {}),
  });
  if (existsSync(stamp)) {
    const saved = JSON.parse(readFileSync(stamp, 'utf8')) as TrainedModel & { key: string };
    if (saved.key === key && Object.values(files).every((f) => existsSync(f))) {
      log(`  reusing the model made earlier (${dir}, ${saved.made})`);
      return { ...saved, files };
    }
  }
  rmSync(dir, { recursive: true, force: true });
  mkdirSync(dir, { recursive: true });
  const started = performance.now();
  setBackend(createOrtBackend({ threads: 2 }));
  const model = previous ? await loadModel(previous.files.f32) : createModel(CONFIG, { seed: SEED });
  model.tokenizer = tokenizer();
  const data = fortunesDataset(model.tokenizer);
  const trainer = new LocalTrainer(model, { lr: stage.lr, totalSteps: stage.steps, warmupSteps: stage.warmup });
  const rng = new Generator(11 + index);
  const losses: number[] = [];
  /** The mean train loss of the last 50 steps. */
  const recent = () => losses.slice(-50).reduce((s, x) => s + x, 0) / Math.min(50, losses.length);
  for (let i = 0; i < stage.steps; i++) {
    losses.push(trainer.step(textBatch(data.train, rng, stage.batch, SEQ)).loss);
    if ((i + 1) % 50 === 0) {
      log(`  stage ${index + 1}, step ${i + 1}/${stage.steps}: train loss ${recent().toFixed(3)} (mean of the last 50), `
        + `${((performance.now() - started) / 1000).toFixed(0)} s`);
    }
  }
  const trainSeconds = (performance.now() - started) / 1000;
  model.eval();
  const heldOut = await heldOutLoss((ids) => model.forward(ids), data.heldOut, { seqLen: SEQ, batchSize: 8, windows: CHECK_WINDOWS });
  const sample = model.tokenizer.decode(greedy(model, model.tokenizer.encode(PROMPT), SAMPLE_TOKENS));
  const known = new Set(model.tokenizer.decode([...data.train]).toLowerCase().match(/[a-z]{2,}/g) ?? []);
  const state = model.hfStateDict();
  for (const f of FORMATS) {
    await hfToGGUF(files[f.ours], {
      config: configToHF(CONFIG), tokenizer: model.tokenizer.toJSON() as Record<string, unknown>,
      weights: [...state].map(([name, t]) => ({ name, shape: [...t.shape] })), read: (n) => state.get(n)!, type: f.type,
    });
  }
  const made: TrainedModel = {
    files, params: model.numParameters(), steps, batch: stage.batch, seq: SEQ, trainSeconds: (previous?.trainSeconds ?? 0) + trainSeconds,
    makeSeconds: (previous?.makeSeconds ?? 0) + (performance.now() - started) / 1000, firstLoss: previous?.firstLoss ?? losses[0],
    lastLoss: recent(), heldOut, sample, wordShare: wordShare(sample, known), made: new Date().toISOString(),
    stages: [
      ...(previous?.stages ?? [{ ...STAGES[0], seconds: previous?.trainSeconds ?? 0 }]).slice(0, index),
      { ...stage, seconds: trainSeconds },
    ],
  };
  writeFileSync(stamp, `${JSON.stringify({ ...made, key }, null, 2)}\n`);
  return { ...made, key };
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const m = await trainedModel();
  log(`Llama ${CONFIG.layers}×${CONFIG.hidden}, ${(m.params / 1e6).toFixed(2)}M parameters: ${m.steps} steps of ${m.batch}×${m.seq} fortune bytes `
    + `in ${m.trainSeconds.toFixed(0)} s (made in ${m.makeSeconds.toFixed(0)} s), train loss ${m.firstLoss.toFixed(2)} → ${m.lastLoss.toFixed(2)}, `
    + `held-out perplexity ${m.heldOut.perplexity.toFixed(3)} (${m.heldOut.tokens} bytes)`);
  log(`greedy after ${JSON.stringify(PROMPT)}: ${JSON.stringify(m.sample)} (${(100 * m.wordShare).toFixed(0)}% of its words occur in the training text)`);
  for (const f of FORMATS) log(`  ${f.gguf}: ${m.files[f.ours]}`);
}
