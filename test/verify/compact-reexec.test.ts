// Issue #30: the validator re-executes compact (bf16 / int8 / int4) decoding records: bit for bit on js, within the format's
// tolerance on ort (ORT_TOLERANCES, calibrated by bench/compact-drift.ts). 1,000 honest re-runs over formats, backends,
// inputs and steps give no false positive; cheats are caught.
import assert from 'node:assert/strict';
import { after, describe, test } from 'node:test';
import { type CausalLM, configToHF, createModel, KVCache, llamaConfig } from '../../src/models/index.ts';
import { sectionCopy } from '../../src/pipeline/index.ts';
import {
  type Backend, createOrtBackend, Generator, jsBackend, noGrad, ortAvailable, packedFromBytes, packedTensor, packedToBytes, packWeight,
  randn, setBackend, type Tensor, tensor, type WeightFormat, withBackend,
} from '../../src/tensor/index.ts';
import {
  agree, auxHash, type Bundle, checkpointHash, compactWeightOf, drift, formatOfWeights, hashTensors, ORT_TOLERANCE, ortTolerance, reexecute,
  sessionStepHash, signRecord, type WorkRecord,
} from '../../src/verify/index.ts';

const FORMATS: readonly WeightFormat[] = ['bf16', 'int8', 'int4'];
// big enough that ort takes the products (MatMulNBits from 32K multiply-adds: every prompt product, most decoding ones)
// weights 4× the initial scale: sharper attention, larger drift (bench/compact-drift.ts)
const config = llamaConfig({
  vocabSize: 64, hidden: 128, layers: 2, heads: 4, kvHeads: 2, intermediate: 256, maxPositions: 64, initializerRange: 0.08,
});
const range: [number, number] = [1, 3];
const hf = configToHF(config);
const signer = { peer: 'worker', seed: new Uint8Array(32).fill(7) };
const PROMPT = 8;
const DECODED = 3;

/** The blocks of a seeded Llama held in `format` (as a worker holds its section once packed). */
function compactSection(format: WeightFormat, layers = config.layers): CausalLM {
  const c = { ...config, layers };
  const part = sectionCopy(createModel(c, { seed: 3 }), [1, layers + 1]);
  for (const [, t] of part.hfStateDict()) if (t.ndim === 2) packWeight(t, format);
  return part;
}

type Step = { input: Tensor; positions: Tensor; keyMask: null };

/** A session's steps: a prompt, then single tokens; hidden states of an embedding's scale (0.02) or unit normal. */
function stepsOf(seed: number): Step[] {
  const scale = seed % 2 === 0 ? 0.02 : 1;
  const at = (from: number, n: number) => tensor(Array.from({ length: n }, (_, i) => from + i), [1, n], 'int32');
  const steps: Step[] = [{ input: randn([1, PROMPT, config.hidden], { seed }).mul(scale), positions: at(0, PROMPT), keyMask: null }];
  for (let i = 0; i < DECODED; i++) {
    steps.push({ input: randn([1, 1, config.hidden], { seed: seed * 100 + i }).mul(scale), positions: at(PROMPT + i, 1), keyMask: null });
  }
  return steps;
}

/** A worker's session on `backend`: each step's output, and its signed record naming `recordBackend`. */
function work(model: CausalLM, steps: Step[], backend: Backend, recordBackend: 'js' | 'ort'): { outputs: Tensor[]; records: WorkRecord[] } {
  const weights = checkpointHash(model);
  return withBackend(backend, () => {
    const cache = new KVCache(model.config.layers);
    const outputs: Tensor[] = [];
    const records: WorkRecord[] = [];
    let position = 0;
    for (const s of steps) {
      const y = noGrad(() => model.forward(s.input, { cache, positions: s.positions, keyMask: null }));
      outputs.push(y);
      records.push(signRecord({
        job: 'job', step: position, micro: 0, stage: range, kind: 'decode', session: 's', input: hashTensors([s.input]), aux: auxHash(s.positions, null),
        output: hashTensors([y]), weights, backend: recordBackend, seq: records.length + 1,
      }, signer));
      position += s.input.shape[1];
    }
    return { outputs, records };
  });
}

/** The record signed again with some fields changed (the worker signs what it claims). */
function resign(record: WorkRecord, changes: Partial<WorkRecord>): WorkRecord {
  const fields: Partial<WorkRecord> = { ...record, ...changes };
  delete fields.sig;
  delete fields.peer;
  return signRecord(fields as Omit<WorkRecord, 'sig' | 'peer'>, signer);
}

/** The weights as the validator holds them after the audit: each compact one rebuilt from its bytes (as they travel). */
function sentWeights(model: CausalLM): Map<string, Tensor> {
  return new Map([...model.hfStateDict()].map(([n, t]) => [n, t.packed
    ? packedTensor(packedFromBytes(t.packed.format, t.packed.rows, t.packed.cols, packedToBytes(t.packed).slice()))
    : t.clone()]));
}

/** The bundle for step `k` of a session. */
function bundleOf(weights: Map<string, Tensor>, steps: Step[], k: number, output?: Tensor): Bundle {
  const history = steps.slice(0, k + 1);
  return {
    config: hf, range, optimizer: { lr: 0 }, weights, history,
    sent: history.map((h) => sessionStepHash(hashTensors([h.input]), auxHash(h.positions, null))), ...(output ? { output } : {}),
  };
}

/**
 * y + ν·‖y − base‖/√n·N(0, 1) (int8, int4: relative drift ≈ ν of what the section added to its input), or y + ν·‖y‖/√n·N(0, 1)
 * (bf16: of the output): noise of ν times the format's tolerance, on what the validator compares.
 */
function noisy(y: Tensor, input: Tensor, format: WeightFormat, times: number, seed: number): Tensor {
  const nu = times * ortTolerance(format);
  const x = y.data as Float32Array;
  const b = format === 'bf16' ? new Float32Array(x.length) : (input.data as Float32Array);
  let norm = 0;
  for (let i = 0; i < x.length; i++) norm += (x[i] - b[i]) ** 2;
  const g = new Generator(seed);
  const scale = (nu * Math.sqrt(norm)) / Math.sqrt(x.length);
  return tensor(x.map((v) => v + scale * g.normal()), y.shape);
}

describe('compact sections: the agreement rules', () => {
  test('a tolerance per format; int8/int4 compare what the section added to its input', () => {
    assert.equal(ortTolerance('f32'), ORT_TOLERANCE);
    assert.equal(ortTolerance('bf16'), ORT_TOLERANCE);
    assert.ok(ortTolerance('int8') > ORT_TOLERANCE && ortTolerance('int4') > ORT_TOLERANCE);
    assert.throws(() => ortTolerance('int3' as WeightFormat), { name: 'InvalidArgumentError' });
    const base = Float32Array.of(100, 100);
    const a = Float32Array.of(101, 100);
    const b = Float32Array.of(101.25, 100); // 0.25 of what was added, 0.0018 of the output
    assert.equal(drift(a, b, base), 0.25);
    assert.ok(agree('ort', a, b, 'int8'), 'on the outputs: within');
    assert.ok(!agree('ort', a, b, 'int8', base), 'on what the section added: not within');
    assert.ok(!agree('ort', a, b, 'bf16', base), 'bf16 compares outputs, at float32\'s tolerance');
    assert.ok(!agree('js', a, Float32Array.of(101, 100.00001), 'int4', base), 'js: bit for bit, whatever the format');
    assert.equal(formatOfWeights([tensor([1], [1])]), 'f32');
    assert.equal(formatOfWeights([...compactSection('int4').hfStateDict().values()]), 'int4');
  });
});

describe('compact sections: a weight as it travels to the validator', () => {
  test('its bytes become the packed weight; bytes of another size, dtype or shape are refused with a reason', () => {
    for (const format of FORMATS) {
      const t = [...compactSection(format).hfStateDict().values()].find((w) => w.packed)!;
      const bytes = packedToBytes(t.packed!);
      const held = compactWeightOf(format, [...t.shape], 'uint8', bytes);
      assert.ok(typeof held !== 'string' && held.packed, format);
      assert.deepEqual(packedToBytes(held.packed), bytes);
      assert.equal(hashTensors([held]), hashTensors([t]), 'it hashes as the worker\'s weight');
      for (const [f, shape, dtype, b, why] of [
        [format, t.shape, 'uint8', bytes.subarray(0, bytes.byteLength - 1), /bytes, not the/],
        [format, t.shape, 'uint8', new Uint8Array(bytes.byteLength + 4), /bytes, not the/],
        [format, t.shape, 'float32', bytes, /float32 bytes/],
        ['int3', t.shape, 'uint8', bytes, /unknown weight format/],
        [format, [t.shape[0] * t.shape[1]], 'uint8', bytes, /not a matrix/],
        [format, [-1, 4], 'uint8', bytes, /not a matrix/],
      ] as const) assert.match(String(compactWeightOf(f, [...shape], dtype, b)), why, format);
    }
  });
});

describe('compact sections: a decoding record re-executed', () => {
  setBackend('js');
  const ort = ortAvailable();
  const ort1 = ort ? createOrtBackend({ threads: 1 }) : jsBackend;
  const ort2 = ort ? createOrtBackend({ threads: 2 }) : jsBackend;
  // another CPU's onnxruntime: its MatMulNBits, every other op rounded as the js kernels round
  const otherCpu: Backend = ort ? { ...jsBackend, name: 'ort', deterministic: false, packedLinear: (x, m, w, y) => ort1.packedLinear!(x, m, w, y) } : jsBackend;
  after(() => setBackend('js'));

  test('js: an honest record reproduces bit for bit; a changed packed byte or a perturbed output fails', () => {
    for (const format of FORMATS) {
      const model = compactSection(format);
      const steps = stepsOf(1);
      const { outputs, records } = work(model, steps, jsBackend, 'js');
      const weights = sentWeights(model);
      for (const [k, record] of records.entries()) {
        const v = reexecute(record, bundleOf(weights, steps, k));
        assert.ok(v.ok, `${format} step ${k}: ${v.reason}`);
        assert.equal(v.output, record.output);
      }
      // the weights it sends are not those its record names (one byte of one packed matrix)
      const swapped = sentWeights(model);
      const [name, w] = [...swapped].find(([, t]) => t.packed)!;
      (w.packed!.data as Uint8Array | Uint16Array)[5] ^= 1;
      const bad = reexecute(records[2], bundleOf(swapped, steps, 2));
      assert.ok(!bad.ok && !bad.inconclusive, `${format} ${name}: ${bad.reason}`);
      assert.match(bad.reason, /weights it kept/);
      // it computed with a changed byte but sends the weights its record names
      const cheat = compactSection(format);
      const cw = [...cheat.hfStateDict().values()].find((t) => t.packed)!;
      (cw.packed!.data as Uint8Array | Uint16Array)[5] ^= 1;
      const { records: forged } = work(cheat, steps, jsBackend, 'js');
      const signed = resign(forged[3], { weights: records[3].weights });
      assert.ok(!reexecute(signed, bundleOf(weights, steps, 3)).ok, `${format}: computed with a changed byte`);
      // an output one ulp off
      const off = outputs[3].clone();
      new Uint32Array((off.data as Float32Array).buffer)[0] ^= 1;
      const perturbed = resign(records[3], { output: hashTensors([off]) });
      assert.ok(!reexecute(perturbed, bundleOf(weights, steps, 3)).ok, `${format}: an output one ulp off`);
    }
  });

  test('ort: an honest record reproduces within the format\'s tolerance; a noisy output or a skipped block fails', { skip: !ort }, () => {
    for (const format of FORMATS) {
      const model = compactSection(format);
      const steps = stepsOf(2);
      const weights = sentWeights(model);
      for (const worker of [ort1, ort2, otherCpu, jsBackend]) {
        const { outputs, records } = work(model, steps, worker, 'ort');
        for (const [k, record] of records.entries()) {
          const v = withBackend(ort2, () => reexecute(record, bundleOf(weights, steps, k, outputs[k])));
          assert.ok(v.ok, `${format} step ${k}: ${v.reason}`);
        }
      }
      const { outputs, records } = work(model, steps, ort1, 'ort');
      // noise 3× the tolerance (of what the section added: the strictest reading), and a section whose second block was skipped
      const noise = noisy(outputs[3], steps[3].input, format, 3, 5);
      const skipped = work(compactSection(format, 1), steps, ort1, 'ort').outputs[3];
      for (const [what, y] of [['noise', noise], ['a skipped block', skipped]] as const) {
        const r = resign(records[3], { output: hashTensors([y]) });
        const v = withBackend(ort2, () => reexecute(r, bundleOf(weights, steps, 3, y)));
        assert.ok(!v.ok && !v.inconclusive, `${format}: ${what} passed`);
      }
    }
  });

  test('1,000 honest re-runs over formats, backends, inputs and steps: no false positive; the cheats are caught', () => {
    // each honest session is computed once by its worker; the validator re-runs every step of it (history up to the step)
    const workers: { name: string; backend: Backend; record: 'js' | 'ort' }[] = [{ name: 'js', backend: jsBackend, record: 'js' }];
    if (ort) {
      workers.push(
        { name: 'ort 1 thread', backend: ort1, record: 'ort' }, { name: 'ort 2 threads', backend: ort2, record: 'ort' },
        { name: 'ort, another CPU', backend: otherCpu, record: 'ort' }, { name: 'ort, float path', backend: jsBackend, record: 'ort' },
      );
    }
    const inputs = Math.ceil(1000 / (FORMATS.length * workers.length * (DECODED + 1)));
    let reruns = 0;
    let falsePositives = 0;
    let caught = 0;
    let cheats = 0;
    const worst = new Map<string, number>();
    const lines: string[] = [];
    for (const format of FORMATS) {
      const model = compactSection(format);
      const weights = sentWeights(model);
      for (const w of workers) {
        let worstHere = 0;
        for (let i = 0; i < inputs; i++) {
          const steps = stepsOf(10 + i);
          const { outputs, records } = work(model, steps, w.backend, w.record);
          for (const [k, record] of records.entries()) {
            // the validator re-runs ort records on its own ort, at 1 or at 2 threads
            const validator = w.record === 'js' ? jsBackend : k % 2 === 0 ? ort2 : ort1;
            const bundle = bundleOf(weights, steps, k, w.record === 'ort' ? outputs[k] : undefined);
            const v = withBackend(validator, () => reexecute(record, bundle));
            reruns++;
            if (!v.ok) {
              falsePositives++;
              lines.push(`false positive: ${format} ${w.name} input ${i} step ${k}: ${v.reason}`);
            }
            if (w.record === 'ort' && k === records.length - 1) {
              // the drift itself, at each session's last step
              const mine = withBackend(validator, () => {
                const cache = new KVCache(model.config.layers);
                let y: Tensor | null = null;
                for (const s of steps.slice(0, k + 1)) {
                  y = noGrad(() => model.forward(s.input, { cache, positions: s.positions, keyMask: null }));
                }
                return y!;
              });
              const base = format === 'bf16' ? undefined : (steps[k].input.data as Float32Array);
              worstHere = Math.max(worstHere, drift(mine.data as Float32Array, outputs[k].data as Float32Array, base));
            }
          }
          // one cheat per session: its last output perturbed (one ulp on js; noise 3× the tolerance on ort)
          const k = records.length - 1;
          const forged = w.record === 'js' ? outputs[k].clone() : noisy(outputs[k], steps[k].input, format, 3, i);
          if (w.record === 'js') new Uint32Array((forged.data as Float32Array).buffer)[i % forged.size] ^= 1;
          const r = resign(records[k], { output: hashTensors([forged]) });
          const v = withBackend(w.record === 'js' ? jsBackend : ort2, () => reexecute(r, bundleOf(weights, steps, k, w.record === 'ort' ? forged : undefined)));
          cheats++;
          if (!v.ok && !v.inconclusive) caught++;
        }
        worst.set(`${format} ${w.name}`, worstHere);
      }
    }
    const drifts = [...worst].filter(([k]) => !k.endsWith(' js')).map(([k, d]) => `${k} ${d.toExponential(2)}`);
    process.stderr.write(`compact re-execution: ${reruns} honest re-runs, ${falsePositives} false positives; ${caught}/${cheats} cheats caught\n`
      + `worst honest drift (int8/int4: of what the section added; tolerances ${FORMATS.map((f) => `${f} ${ortTolerance(f)}`).join(', ')}):\n  ${drifts.join('\n  ')}\n`);
    for (const l of lines.slice(0, 5)) process.stderr.write(`${l}\n`);
    assert.ok(reruns >= 1000 || !ort, `${reruns} re-runs`);
    assert.equal(falsePositives, 0);
    assert.equal(caught, cheats);
  });
});
