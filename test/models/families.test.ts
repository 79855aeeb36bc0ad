// Issue #45: a model family is one record in src/models/families/ plus one line in the registry. This test walks the
// registry: every family must have a transformers fixture (test/fixtures/hf/<name>/) whose logits it equals, every
// fixture must belong to a family, each family's checkpoint-name table must be what its built block holds (the
// planner counts parameters from that table), and each family's `init-model` shape must build and round-trip.
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, test } from 'node:test';
import {
  type CausalLM, configFromHF, configToHF, createModel, FAMILIES, familyNames, familyOf, llamaConfig, loadConfig, loadModel, modelLayers,
} from '../../src/models/index.ts';
import { setBackend } from '../../src/tensor/index.ts';
import { HF_FIXTURES, hfFixtureNames, readHFReference } from '../helpers/hf-fixtures.ts';
import { relErr } from '../helpers/weights.ts';

/** The logits' bar of hf-fixtures.test.ts: max |ours − transformers'| / max |transformers'|. */
const LOGITS_TOLERANCE = 1e-4;

/**
 * Fixtures whose reference was made from a model cast whole to bfloat16, rotary buffer included (see
 * hf-fixtures.test.ts's CAST_WHOLE): compared as loaded, within what that rounding explains.
 */
const AS_LOADED: Record<string, number> = { 'llama3-bf16-sharded': 5e-3 };

describe('the family registry', () => {
  setBackend('js');

  test('lists each family once, under its Hugging Face model_type', () => {
    const names = familyNames();
    assert.equal(new Set(names).size, names.length, `a family listed twice: ${names.join(', ')}`);
  });

  test('every fixture folder belongs to exactly one family', () => {
    const claimed = FAMILIES.flatMap((f) => f.fixtures);
    const orphans = hfFixtureNames().filter((n) => !claimed.includes(n));
    assert.deepEqual(orphans, [], `fixtures no family lists: ${orphans.join(', ')}`);
    assert.equal(new Set(claimed).size, claimed.length, `a fixture claimed twice: ${claimed.join(', ')}`);
  });

  test('a 70B config is profiled from the name tables without its weights', () => {
    // Llama-2-70B: 68,976,648,192 parameters
    const config = llamaConfig({ hidden: 8192, layers: 80, heads: 64, kvHeads: 8, intermediate: 28672, vocabSize: 32000 });
    const started = performance.now();
    const params = modelLayers(config).reduce((sum, l) => sum + l.profile().params, 0);
    assert.equal(params, 68_976_648_192);
    assert.ok(performance.now() - started < 2000, 'profiling allocates nothing');
  });

  for (const family of FAMILIES) {
    describe(family.name, () => {
      test('has a fixture from transformers', () => {
        assert.ok(family.fixtures.length > 0, `family '${family.name}' has no fixture: add test/fixtures/hf/<name>/ (make_hf_fixtures.py) and list it`);
        for (const name of family.fixtures) {
          assert.ok(existsSync(join(HF_FIXTURES, name, 'config.json')), `family '${family.name}': fixture '${name}' is not in test/fixtures/hf/`);
        }
      });

      for (const name of family.fixtures) {
        test(`${name}: its logits equal transformers'`, async () => {
          assert.ok(existsSync(join(HF_FIXTURES, name, 'config.json')), `family '${family.name}': fixture '${name}' is missing`);
          const raw = JSON.parse(readFileSync(join(HF_FIXTURES, name, 'config.json'), 'utf8')) as Record<string, unknown>;
          assert.equal(raw.model_type, family.name, `fixture '${name}' is a ${String(raw.model_type)}, listed by family '${family.name}'`);
          const ref = readHFReference(name);
          const model = await loadModel(ref.dir);
          assert.equal(familyOf(model.config), family, `fixture '${name}' loads as family '${familyOf(model.config).name}'`);
          const logits = model.forward(ref.inputIds);
          assert.deepEqual([...logits.shape], [...ref.logits.shape], `${name}: logits shape`);
          const err = relErr(logits.data, ref.logits.data);
          assert.ok(err < (AS_LOADED[name] ?? LOGITS_TOLERANCE), `${name}: logits relative error ${err}`);
        });

        test(`${name}: the checkpoint-name table is what each block holds, and the record's profile the planner's`, () => {
          const config = loadConfig(join(HF_FIXTURES, name));
          const model = createModel(config, { init: false });
          assertBlocksMatchTable(model, (i) => family.blockWeights(config, i));
          const planned = modelLayers(config).filter((l) => l.kind === 'block');
          for (const layer of planned) assert.deepEqual(family.blockProfile(config, layer.blockIndex), layer.profile(), layer.name);
        });
      }

      test('its init-model shape builds, and its config round-trips through config.json', () => {
        const small = family.small({
          vocabSize: 257, hidden: 64, heads: 4, layers: 2, maxPositions: 64, bosTokenId: 256, eosTokenId: 256, kvHeads: family.name === 'falcon' ? 2 : 4,
        });
        const model = createModel(small, { seed: 1 });
        assert.equal(familyOf(model.config), family);
        assert.deepEqual(configFromHF(JSON.parse(JSON.stringify(configToHF(small))) as Record<string, unknown>), small);
        assertBlocksMatchTable(model, (i) => family.blockWeights(small, i));
      });
    });
  }
});

/** Every block's parameters are its family's table (names and shapes), and its profile counts them. */
function assertBlocksMatchTable(model: CausalLM, table: (i: number) => [string, number[]][]): void {
  const blocks = model.wholeLayers.filter((l) => l.kind === 'block');
  assert.ok(blocks.length > 0);
  for (const layer of blocks) {
    const prefix = `${layer.name}.`;
    const built = layer.namedParameters().map(([n, t]): [string, number[]] => [n.slice(prefix.length), [...t.shape]]);
    const want = table(layer.blockIndex);
    const key = (w: [string, number[]]) => `${w[0]} [${w[1].join(', ')}]`;
    assert.deepEqual(built.map(key).sort(), want.map(key).sort(), `${layer.name}: the table's names and shapes`);
    const count = built.reduce((s, [, shape]) => s + shape.reduce((a, b) => a * b, 1), 0);
    assert.equal(layer.profile().params, count, `${layer.name}: profiled parameters`);
  }
}
