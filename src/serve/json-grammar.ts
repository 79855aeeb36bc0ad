import { InvalidArgumentError } from '../errors.ts';

/**
 * JSON that a grammar admits, character by character, for constrained decoding (`response_format`): a JSON schema's
 * subset compiled to nodes, and a machine of frames (a stack: the value being written inside the values that hold it)
 * that takes one character at a time, refuses what cannot continue valid JSON of the schema, and clones cheaply (a
 * candidate token is tried on a clone). Output is compact: no whitespace between tokens of JSON, an object's
 * properties in the schema's order, each of them written, no escapes in strings.
 */

/** A compiled schema node. */
export type JsonNode
  = | { kind: 'object'; props: { key: string; node: JsonNode }[] }
    | { kind: 'array'; items: JsonNode; minItems: number; maxItems: number }
    | { kind: 'string'; maxLength: number }
    | { kind: 'number'; integer: boolean }
    | { kind: 'literal'; options: string[] }
    | { kind: 'any'; depth: number }
    | { kind: 'freeObject'; depth: number };

/** Longest string a schema without `maxLength` (and any string of `json_object`) may hold. */
export const MAX_STRING = 256;
/** Digits an integer part holds at most, and a fraction. */
const MAX_DIGITS = 16;
const MAX_FRACTION = 8;
/** Nesting of `json_object`'s free-form values. */
const MAX_DEPTH = 6;
/** Items of an array without `maxItems`. */
const MAX_ITEMS = 64;

const KNOWN = new Set(['type', 'properties', 'required', 'additionalProperties', 'items', 'minItems', 'maxItems', 'maxLength', 'enum', 'const',
  'title', 'description', '$schema']);

/** Compiles the subset of JSON Schema this grammar follows; anything else is a 400 naming it. */
export function compileSchema(schema: unknown, path = 'schema'): JsonNode {
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) throw new InvalidArgumentError(`${path} must be a JSON schema object`);
  const s = schema as Record<string, unknown>;
  for (const key of Object.keys(s)) if (!KNOWN.has(key)) throw new InvalidArgumentError(`${path}: '${key}' is not supported in a response_format schema`);
  if (s.const !== undefined) return { kind: 'literal', options: [JSON.stringify(s.const)] };
  if (s.enum !== undefined) {
    if (!Array.isArray(s.enum) || s.enum.length === 0) throw new InvalidArgumentError(`${path}.enum must be a non-empty array`);
    return { kind: 'literal', options: s.enum.map((v) => JSON.stringify(v)) };
  }
  const int = (key: string, fallback: number) => {
    const v = s[key];
    if (v === undefined) return fallback;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new InvalidArgumentError(`${path}.${key} must be a non-negative integer`);
    return v;
  };
  switch (s.type) {
    case 'object': {
      const props = (s.properties ?? {}) as Record<string, unknown>;
      if (typeof props !== 'object' || props === null) throw new InvalidArgumentError(`${path}.properties must be an object`);
      const keys = Object.keys(props);
      if (keys.length === 0) return { kind: 'literal', options: ['{}'] };
      return { kind: 'object', props: keys.map((key) => ({ key, node: compileSchema(props[key], `${path}.properties.${key}`) })) };
    }
    case 'array': {
      const minItems = int('minItems', 0);
      const maxItems = int('maxItems', MAX_ITEMS);
      if (minItems > maxItems) throw new InvalidArgumentError(`${path}: minItems is above maxItems`);
      return { kind: 'array', items: compileSchema(s.items ?? {}, `${path}.items`), minItems, maxItems };
    }
    case 'string':
      return { kind: 'string', maxLength: int('maxLength', MAX_STRING) };
    case 'integer':
    case 'number':
      return { kind: 'number', integer: s.type === 'integer' };
    case 'boolean':
      return { kind: 'literal', options: ['true', 'false'] };
    case 'null':
      return { kind: 'literal', options: ['null'] };
    case undefined:
      return { kind: 'any', depth: 0 };
    default:
      throw new InvalidArgumentError(`${path}.type '${String(s.type)}' is not supported (object, array, string, integer, number, boolean, null)`);
  }
}

/** What a frame does with a character: takes it, refuses it, or hands it to a new frame it opens (pushed on the stack). */
type Step = 'ok' | 'no' | Frame;

interface Frame {
  accept(c: string): Step;
  /** Its value is whole here (a parent may take the next character instead). */
  canEnd(): boolean;
  /** Its value is whole and can take nothing more: it leaves the stack at once. */
  mustEnd(): boolean;
  clone(): Frame;
}

/** A frame whose value is whole once it closed (a bracket, a quote, a value of its own): it then takes nothing more. */
abstract class ClosingFrame implements Frame {
  abstract accept(c: string): Step;
  abstract clone(): Frame;
  protected abstract closed(): boolean;

  canEnd(): boolean {
    return this.closed();
  }

  mustEnd(): boolean {
    return this.closed();
  }
}

function open(node: JsonNode): Frame {
  switch (node.kind) {
    case 'object':
      return new ObjectFrame(node.props);
    case 'array':
      return new ArrayFrame(node.items, node.minItems, node.maxItems);
    case 'string':
      return new StringFrame(node.maxLength);
    case 'number':
      return new NumberFrame(node.integer);
    case 'literal':
      return new LiteralFrame(node.options);
    case 'any':
      return new AnyFrame(node.depth);
    case 'freeObject':
      return new FreeObjectFrame(node.depth);
  }
}

/** An object of fixed properties: its text and its values in turn ('{"a":', value, ',"b":', value, '}'). */
class ObjectFrame implements Frame {
  private readonly parts: (string | JsonNode)[];
  constructor(props: { key: string; node: JsonNode }[], private part = 0, private at = 0, parts?: (string | JsonNode)[]) {
    this.parts = parts ?? props.flatMap((p, i) => [`${i === 0 ? '{' : ','}${JSON.stringify(p.key)}:`, p.node]).concat(['}']);
  }

  accept(c: string): Step {
    const p = this.parts[this.part];
    if (p === undefined) return 'no';
    if (typeof p !== 'string') {
      this.part++;
      return open(p);
    }
    if (p[this.at] !== c) return 'no';
    if (++this.at === p.length) {
      this.part++;
      this.at = 0;
    }
    return 'ok';
  }

  canEnd(): boolean {
    return this.part >= this.parts.length;
  }

  mustEnd(): boolean {
    return this.canEnd();
  }

  clone(): Frame {
    return new ObjectFrame([], this.part, this.at, this.parts);
  }
}

class ArrayFrame extends ClosingFrame {
  constructor(
    private readonly items: JsonNode, private readonly min: number, private readonly max: number,
    private state: 'open' | 'first' | 'after' | 'next' | 'done' = 'open', private count = 0,
  ) {
    super();
  }

  accept(c: string): Step {
    switch (this.state) {
      case 'open':
        if (c !== '[') return 'no';
        this.state = 'first';
        return 'ok';
      case 'first':
        if (c === ']') return this.close();
        if (this.max === 0) return 'no';
        return this.item();
      case 'after':
        if (c === ']') return this.close();
        if (c !== ',' || this.count >= this.max) return 'no';
        this.state = 'next';
        return 'ok';
      case 'next':
        return this.item();
      default:
        return 'no';
    }
  }

  private item(): Step {
    this.count++;
    this.state = 'after';
    return open(this.items);
  }

  private close(): Step {
    if (this.count < this.min) return 'no';
    this.state = 'done';
    return 'ok';
  }

  protected closed(): boolean {
    return this.state === 'done';
  }

  clone(): Frame {
    return new ArrayFrame(this.items, this.min, this.max, this.state, this.count);
  }
}

class StringFrame extends ClosingFrame {
  constructor(private readonly max: number, private state: 'open' | 'in' | 'done' = 'open', private length = 0) {
    super();
  }

  accept(c: string): Step {
    if (this.state === 'open') {
      if (c !== '"') return 'no';
      this.state = 'in';
      return 'ok';
    }
    if (this.state !== 'in') return 'no';
    if (c === '"') {
      this.state = 'done';
      return 'ok';
    }
    // no escapes and no control characters: what is written is the string itself
    if (c === '\\' || c < ' ' || this.length >= this.max) return 'no';
    this.length++;
    return 'ok';
  }

  protected closed(): boolean {
    return this.state === 'done';
  }

  clone(): Frame {
    return new StringFrame(this.max, this.state, this.length);
  }
}

/** -?(0|[1-9][0-9]*)(\.[0-9]+)? with bounded digits (no exponent). */
class NumberFrame implements Frame {
  constructor(
    private readonly integer: boolean,
    private state: 'start' | 'sign' | 'zero' | 'int' | 'dot' | 'frac' = 'start', private digits = 0,
  ) {}

  accept(c: string): Step {
    const digit = c >= '0' && c <= '9';
    const { state } = this;
    if (state === 'start' && c === '-') {
      this.state = 'sign';
      return 'ok';
    }
    if (state === 'start' || state === 'sign') {
      if (!digit) return 'no';
      this.state = c === '0' ? 'zero' : 'int';
      this.digits = 1;
      return 'ok';
    }
    if (state === 'int' && digit) {
      if (this.digits >= MAX_DIGITS) return 'no';
      this.digits++;
      return 'ok';
    }
    if (state === 'int' || state === 'zero') {
      if (c !== '.' || this.integer) return 'no';
      this.state = 'dot';
      this.digits = 0;
      return 'ok';
    }
    if (!digit || this.digits >= MAX_FRACTION) return 'no';
    this.state = 'frac';
    this.digits++;
    return 'ok';
  }

  canEnd(): boolean {
    return this.state === 'zero' || this.state === 'int' || this.state === 'frac';
  }

  mustEnd(): boolean {
    return this.canEnd() && (this.integer ? this.state === 'zero' || this.digits >= MAX_DIGITS : this.state === 'frac' && this.digits >= MAX_FRACTION);
  }

  clone(): Frame {
    return new NumberFrame(this.integer, this.state, this.digits);
  }
}

/** One of fixed texts (an enum's JSON, true/false, null). */
class LiteralFrame implements Frame {
  constructor(private options: string[], private at = 0) {}

  accept(c: string): Step {
    const next = this.options.filter((o) => o[this.at] === c);
    if (next.length === 0) return 'no';
    this.options = next;
    this.at++;
    return 'ok';
  }

  canEnd(): boolean {
    return this.options.some((o) => o.length === this.at);
  }

  mustEnd(): boolean {
    return this.options.every((o) => o.length === this.at);
  }

  clone(): Frame {
    return new LiteralFrame(this.options, this.at);
  }
}

/** Any JSON value (`json_object`'s members, a schema node without a type), nested at most MAX_DEPTH deep. */
class AnyFrame extends ClosingFrame {
  constructor(private readonly depth: number, private done = false) {
    super();
  }

  accept(c: string): Step {
    if (this.done) return 'no';
    this.done = true;
    return open(anyNode(c, this.depth));
  }

  protected closed(): boolean {
    return this.done;
  }

  clone(): Frame {
    return new AnyFrame(this.depth, this.done);
  }
}

/** The node a free-form value starting with `c` is. */
function anyNode(c: string, depth: number): JsonNode {
  const inner: JsonNode = { kind: 'any', depth: depth + 1 };
  if (c === '{') return depth < MAX_DEPTH ? { kind: 'freeObject', depth } : { kind: 'literal', options: ['{}'] };
  if (c === '[') return { kind: 'array', items: depth < MAX_DEPTH ? inner : { kind: 'literal', options: ['null'] }, minItems: 0, maxItems: MAX_ITEMS };
  if (c === '"') return { kind: 'string', maxLength: MAX_STRING };
  if (c === '-' || (c >= '0' && c <= '9')) return { kind: 'number', integer: false };
  return { kind: 'literal', options: ['true', 'false', 'null'] };
}

/** An object of free-form members: '{' ( '"key":' value ( ',' '"key":' value )* )? '}'. */
class FreeObjectFrame extends ClosingFrame {
  constructor(private readonly depth: number, private state: 'open' | 'first' | 'key' | 'colon' | 'value' | 'after' | 'done' = 'open') {
    super();
  }

  accept(c: string): Step {
    switch (this.state) {
      case 'open':
        if (c !== '{') return 'no';
        this.state = 'first';
        return 'ok';
      case 'first':
        if (c === '}') return this.close();
        this.state = 'colon';
        return new StringFrame(MAX_STRING);
      case 'key':
        this.state = 'colon';
        return new StringFrame(MAX_STRING);
      case 'colon':
        if (c !== ':') return 'no';
        this.state = 'value';
        return 'ok';
      case 'value':
        this.state = 'after';
        return open(anyNode(c, this.depth + 1));
      case 'after':
        if (c === '}') return this.close();
        if (c !== ',') return 'no';
        this.state = 'key';
        return 'ok';
      default:
        return 'no';
    }
  }

  private close(): Step {
    this.state = 'done';
    return 'ok';
  }

  protected closed(): boolean {
    return this.state === 'done';
  }

  clone(): Frame {
    return new FreeObjectFrame(this.depth, this.state);
  }
}

/** `json_object`'s root: a free-form object. */
export const ANY_OBJECT: JsonNode = { kind: 'freeObject', depth: 0 };

/** The stack of frames: what has been written so far, as far as it constrains what may follow. */
export class JsonMachine {
  private constructor(private readonly stack: Frame[], private started: boolean) {}

  static of(root: JsonNode): JsonMachine {
    return new JsonMachine([open(root)], false);
  }

  /** The document is whole: nothing more may be written. */
  get complete(): boolean {
    return this.started && this.stack.length === 0;
  }

  /** The document may end here (a number at its top level could still go on). */
  get canStop(): boolean {
    return this.started && this.stack.every((f) => f.canEnd());
  }

  clone(): JsonMachine {
    return new JsonMachine(this.stack.map((f) => f.clone()), this.started);
  }

  /** Takes `text` character by character; false (the machine then undefined) at the first it cannot take. */
  feed(text: string): boolean {
    for (const c of text) if (!this.take(c)) return false;
    return true;
  }

  private take(c: string): boolean {
    this.started = true;
    for (;;) {
      const top = this.stack[this.stack.length - 1];
      if (!top) return false;
      const step = top.accept(c);
      if (step === 'ok') {
        this.settle();
        return true;
      }
      if (step !== 'no') {
        // a value opens: the character is its first
        this.stack.push(step);
        continue;
      }
      // a value that may end here ends, and the character goes to the value that holds it
      if (!top.canEnd()) return false;
      this.stack.pop();
    }
  }

  /** Values that are whole and take nothing more leave the stack. */
  private settle(): void {
    while (this.stack.length > 0 && this.stack[this.stack.length - 1].mustEnd()) this.stack.pop();
  }
}

/**
 * Constrained sampling for one sequence: the logits of tokens that cannot continue the document are set to −∞; once
 * the document is whole only `end` (end of sequence) may follow. `texts[id]` is what token id decodes to alone (tokens
 * that decode to nothing or to part of a character are never allowed).
 */
export class JsonConstraint {
  private machine: JsonMachine;

  constructor(root: JsonNode, private readonly texts: readonly string[], private readonly end: number | null) {
    this.machine = JsonMachine.of(root);
  }

  get complete(): boolean {
    return this.machine.complete;
  }

  /** A copy of `logits` with what may not come next at −∞ (every token refused: the end of sequence alone). */
  mask(logits: Float32Array): Float32Array {
    const out = new Float32Array(logits.length).fill(-Infinity);
    let any = false;
    if (!this.machine.complete) {
      for (let id = 0; id < logits.length && id < this.texts.length; id++) {
        const t = this.texts[id];
        if (t.length === 0 || t.includes('\uFFFD') || id === this.end) continue;
        if (this.machine.clone().feed(t)) {
          out[id] = logits[id];
          any = true;
        }
      }
    }
    const stop = this.machine.canStop || !any;
    if (stop && this.end !== null && this.end < logits.length) out[this.end] = logits[this.end];
    else if (!any) return logits;
    return out;
  }

  /** The token chosen: the document goes on by its text (a token the mask did not allow breaks the constraint). */
  advance(id: number): void {
    if (id === this.end) return;
    if (!this.machine.feed(this.texts[id] ?? '')) this.machine = JsonMachine.of({ kind: 'literal', options: [] });
  }
}
