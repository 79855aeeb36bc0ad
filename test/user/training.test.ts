import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import { additionTask } from '../../src/data/index.ts';
import { byteLevelTokenizerJson, createModel, gpt2Config, HFTokenizer, loadModel } from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { localRunner, readState, runTraining, STATE_FILE, taskSource } from '../../src/index.ts';

const config = gpt2Config({ vocabSize: 257, hidden: 16, layers: 2, heads: 2, maxPositions: 16 });

function newModel() {
  const model = createModel(config, { seed: 5 });
  model.tokenizer = new HFTokenizer(byteLevelTokenizerJson() as Record<string, unknown>);
  return model;
}

test('runTraining (the library\'s loop): stopped with a checkpoint and resumed, a run is the straight run bit for bit', async () => {
  setBackend('js');
  const dir = mkdtempSync(join(tmpdir(), 'tl-training-'));
  try {
    const task = additionTask({ seed: 0, testSize: 8 });
    const run = (model: ReturnType<typeof newModel>, resumeFrom: string | null) => {
      const source = taskSource(task, model.tokenizer!, 4, 8);
      const runner = localRunner(model, { source, steps: 4, lr: 1e-2, microBatches: 1, resumeFrom });
      return { source, runner };
    };
    const straight = run(newModel(), null);
    const evaluated: number[] = [];
    const all = await runTraining({
      ...straight, steps: 4, evalEvery: 2, seed: 0, lr: 1e-2, onEvaluation: (e) => evaluated.push(e.step),
    });
    assert.equal(all.losses.length, 4);
    assert.deepEqual(evaluated, [2, 4]);
    assert.deepEqual(all.evals.map((e) => [e.step, e.metric]), [[2, 'accuracy'], [4, 'accuracy']]);

    const first = run(newModel(), null);
    const half = await runTraining({ ...first, steps: 4, stopAt: 1, evalEvery: 2, seed: 0, lr: 1e-2, out: dir });
    assert.equal(half.steps, 1);
    assert.ok(readdirSync(dir).includes(STATE_FILE));
    const state = readState(dir);
    assert.equal(state.step, 1);
    // the checkpoint's weights and optimizer state go on where the first run stopped
    const resumedModel = await loadModel(dir);
    const rest = run(resumedModel, dir);
    const resumed = await runTraining({ ...rest, steps: 4, evalEvery: 2, seed: 0, lr: 1e-2, out: dir, resumeFrom: state });
    assert.deepEqual(resumed.losses, all.losses);
    assert.deepEqual(resumed.evals.map((e) => e.value), all.evals.filter((e) => e.step > 1).map((e) => e.value));
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});
