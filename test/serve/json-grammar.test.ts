import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { ANY_OBJECT, compileSchema, JsonConstraint, JsonMachine, type JsonNode } from '../../src/serve/json-grammar.ts';
import { Generator } from '../../src/tensor/index.ts';

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 6 },
    age: { type: 'integer' },
    score: { type: 'number' },
    ok: { type: 'boolean' },
    tag: { enum: ['a', 'ab', 3] },
    xs: { type: 'array', items: { type: 'integer' }, maxItems: 3 },
    nested: { type: 'object', properties: { n: { type: 'null' } } },
  },
  required: ['name', 'age'],
};

/** Whether `value` is JSON of the schema (the subset compileSchema takes). */
function matches(value: unknown, schema: Record<string, unknown>): boolean {
  if (schema.enum) return (schema.enum as unknown[]).some((e) => JSON.stringify(e) === JSON.stringify(value));
  switch (schema.type) {
    case 'object': {
      if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
      const props = schema.properties as Record<string, Record<string, unknown>>;
      return Object.entries(props).every(([k, s]) => k in value && matches((value as Record<string, unknown>)[k], s));
    }
    case 'array': {
      const items = schema.items as Record<string, unknown>;
      return Array.isArray(value) && value.length <= ((schema.maxItems as number) ?? Infinity) && value.every((v) => matches(v, items));
    }
    case 'string':
      return typeof value === 'string' && value.length <= ((schema.maxLength as number) ?? Infinity);
    case 'integer':
      return Number.isInteger(value);
    case 'number':
      return typeof value === 'number';
    case 'boolean':
      return typeof value === 'boolean';
    case 'null':
      return value === null;
    default:
      return true;
  }
}

const CHARS = [...'{}[]":,.-0123456789abcdefghijklmnopqrstuvwxyz AB_trufalsn'];

/** A random document the machine admits: a random allowed character at each step, until it is whole. */
function walk(root: JsonNode, rng: Generator): string {
  const m = JsonMachine.of(root);
  let text = '';
  for (let i = 0; i < 2000 && !m.complete; i++) {
    const allowed = CHARS.filter((c) => m.clone().feed(c));
    // a document that may end here (a number at the top) ends with some chance
    if (allowed.length === 0 || (m.canStop && rng.uniform() < 0.2)) break;
    const c = allowed[Math.floor(rng.uniform() * allowed.length)];
    assert.ok(m.feed(c));
    text += c;
  }
  return text;
}

describe('JSON grammar for constrained decoding', () => {
  test('a schema\'s machine admits its documents and refuses what cannot continue one', () => {
    const root = compileSchema(SCHEMA);
    const good = '{"name":"bo","age":-12,"score":0.5,"ok":false,"tag":"ab","xs":[1,22],"nested":{"n":null}}';
    const m = JsonMachine.of(root);
    assert.ok(m.feed(good));
    assert.ok(m.complete);
    for (const bad of ['{"x', '{"name":"bobobob', '{"name":"bo","age":1.5', '{"name":"bo","age":01', '{"name":"bo","age":1,"score":1,"ok":yes',
      '{"name":"bo","age":1,"score":1,"ok":true,"tag":"b"', '{"name":"bo","age":1,"score":1,"ok":true,"tag":3,"xs":[1,2,3,4', ' {']) {
      const b = JsonMachine.of(root);
      const prefixOk = b.feed(bad.slice(0, -1));
      assert.ok(!prefixOk || !b.feed(bad.slice(-1)), bad);
    }
  });

  test('200 random walks of a schema and of json_object: each parses, and matches its schema', () => {
    const rng = new Generator(3);
    const root = compileSchema(SCHEMA);
    for (let i = 0; i < 100; i++) {
      const text = walk(root, rng);
      const value = JSON.parse(text) as unknown;
      assert.ok(matches(value, SCHEMA), text);
    }
    for (let i = 0; i < 100; i++) {
      const text = walk(ANY_OBJECT, rng);
      const value = JSON.parse(text) as unknown;
      assert.ok(typeof value === 'object' && value !== null && !Array.isArray(value), text);
    }
  });

  test('the mask leaves the tokens that continue the document, and the end once it is whole', () => {
    const texts = ['{', '}', '"', 'a', '{"name":"', 'bo"', ',"age":', '7', '}x', '\uFFFD', ''];
    const end = texts.length;
    const c = new JsonConstraint(compileSchema({ type: 'object', properties: { name: { type: 'string' }, age: { type: 'integer' } } }), texts, end);
    const logits = new Float32Array(texts.length + 1).fill(1);
    const allowed = () => [...c.mask(logits)].flatMap((v, i) => (v === -Infinity ? [] : [i]));
    assert.deepEqual(allowed(), [0, 4]);
    for (const id of [4, 5, 6, 7]) c.advance(id);
    assert.deepEqual(allowed(), [1, 7, 8].filter((i) => texts[i] !== '}x'));
    c.advance(1);
    assert.ok(c.complete);
    assert.deepEqual(allowed(), [end]);
  });

  test('what the grammar does not follow is refused by name', () => {
    assert.throws(() => compileSchema({ type: 'string', pattern: '^a' }), /'pattern' is not supported/);
    assert.throws(() => compileSchema({ type: 'date' }), /type 'date' is not supported/);
    assert.throws(() => compileSchema({ type: 'array', minItems: 3, maxItems: 2 }), /minItems is above maxItems/);
  });
});
