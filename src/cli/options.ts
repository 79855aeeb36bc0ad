/**
 * The CLI's options, each declared once: its kind, the name of its value, its default and a one-line help. Groups hold
 * the options several commands share (network, plan, model, format, verification, chain, node, output); a command
 * (spec.ts) takes groups and options of its own. Parsing, validation messages and `--help` are made from these
 * declarations (parse.ts, help.ts). This module imports nothing heavy: every command's declarations load at each start.
 */
import { backendNames } from '../tensor/index.ts';

/**
 * How an option's value is read: `int` and `number` (at least `min`), `enum` (one of `choices`), `bytes` (4GiB, 512MiB),
 * `string`, `list` (comma-separated), `repeatable` (given once per value), `boolean` (a switch without a value).
 */
export type OptionKind = 'int' | 'number' | 'string' | 'enum' | 'bytes' | 'boolean' | 'list' | 'repeatable';

export interface OptionSpec {
  kind: OptionKind;
  /** The value's name in help (N, DIR, MULTIADDR); a switch has none. */
  value?: string;
  /** One line: what the option does. */
  help: string;
  /** What the command uses without the option (shown in help). */
  default?: string | number | boolean;
  /** The least value of an int or a number. */
  min?: number;
  /** The values an enum takes. */
  choices?: readonly string[];
  /** Or where they come from, when that is heavy code (the model families): read only for the command that runs. */
  loadChoices?: () => Promise<readonly string[]>;
  /** The heading it is listed under in help (a group's name; none: the command's own). */
  group?: string;
}

/** A command's options by name (without the leading `--`). */
export type Options = Record<string, OptionSpec>;

type Extra = Partial<Omit<OptionSpec, 'kind' | 'help' | 'value' | 'loadChoices'>>;

/** An integer option, at least 1 unless `min` says otherwise. */
export const int = (value: string, help: string, extra: Extra = {}): OptionSpec => ({ kind: 'int', value, help, min: 1, ...extra });
/** A number option, at least 0 unless `min` says otherwise. */
export const num = (value: string, help: string, extra: Extra = {}): OptionSpec => ({ kind: 'number', value, help, min: 0, ...extra });
export const str = (value: string, help: string, extra: Extra = {}): OptionSpec => ({ kind: 'string', value, help, ...extra });
export const choice = (choices: readonly string[], help: string, extra: Extra = {}): OptionSpec =>
  ({ kind: 'enum', value: choices.join('|'), choices, help, ...extra });
/** An enum whose values `load` reads (heavy code, loaded only for the command that runs); `value` names them until then. */
export const lazyChoice = (value: string, load: () => Promise<readonly string[]>, help: string, extra: Extra = {}): OptionSpec =>
  ({ kind: 'enum', value, loadChoices: load, help, ...extra });
export const bytes = (help: string, extra: Extra = {}): OptionSpec => ({ kind: 'bytes', value: 'SIZE', help, ...extra });
export const flag = (help: string, extra: Extra = {}): OptionSpec => ({ kind: 'boolean', help, ...extra });
export const list = (value: string, help: string, extra: Extra = {}): OptionSpec => ({ kind: 'list', value, help, ...extra });
export const repeatable = (value: string, help: string, extra: Extra = {}): OptionSpec => ({ kind: 'repeatable', value, help, ...extra });

/** The same option with other words or another default for one command (`--strategy`'s default differs by command). */
export function withSpec(option: OptionSpec, changes: Extra & { help?: string; value?: string }): OptionSpec {
  return { ...option, ...changes };
}

/** Options under one heading. */
function group<T extends Options>(name: string, options: T): T {
  return Object.fromEntries(Object.entries(options).map(([k, o]) => [k, { ...o, group: name }])) as T;
}

/** The partition strategies (plan/): `--strategy`'s choices. */
export const STRATEGIES = ['layer-aware', 'parameter-balanced', 'ring-memory-weighted'] as const;

/** The levels of a node's log (p2p's logger). */
export const LOG_LEVELS = ['debug', 'info', 'warn', 'error', 'silent'] as const;

/** Every command takes these. */
export const OUTPUT = group('every command takes', {
  json: flag('machine-readable: one JSON object on stdout, human progress on stderr'),
  // the backend registry's names (tensor/'s entry loads no native part, and main.ts imports it at every start anyway)
  backend: choice(backendNames(), 'the compute backend: js (bitwise reproducible), ort (onnxruntime: fast)', { default: 'ort where it loads, else js' }),
  threads: int('N', 'onnxruntime threads, idle ones asleep: for nodes that share a machine', { default: 'every core' }),
  help: flag('this help'),
});

/** Where a user's command runs: this process, a local swarm, or an existing swarm. */
export const NETWORK = group('network', {
  local: int('N', 'run on a local swarm of N workers and a validator, each its own process; 0: in this process', { min: 0, default: 0 }),
  bootstrap: str('MULTIADDR', 'the validator of an existing swarm (its ready line\'s address); several, comma-separated, to move on when one is gone'),
  listen: str('MULTIADDR', 'where this node listens (reachable by the workers across machines)', { default: '127.0.0.1, any free port' }),
});

/** Speculative decoding: how tokens are drafted to be checked several per trip through the model. */
export const SPECULATIVE = group('speculative decoding', {
  'speculative': str('lookup', 'draft tokens and check several per pass through the model (prompt lookup): fewer trips, the same tokens'),
  'draft': str('DIR|FILE.gguf', 'draft with a small model of the same tokenizer, held whole here (speculative decoding: the same tokens)'),
  'draft-tokens': int('N', 'with --speculative or --draft: the most tokens drafted for one pass (the number adapts)', { min: 1, default: 8 }),
});

/** How a job is split across workers. */
export const PLAN = group('plan', {
  strategy: choice(STRATEGIES, 'how the model is split across the workers', { default: 'layer-aware' }),
  privacy: choice(['ends', 'none'], 'ends: the embedding and the head stay in this process (token ids and logits never leave it)', { default: 'ends' }),
});

/** The model a command uses. */
export const MODEL = group('model', {
  model: str('DIR', 'the model: a Hugging Face checkpoint directory or a .gguf file'),
  ends: str('DIR', 'a hosted model\'s ends (embedding, final norm, head, tokenizer), as pull-ends writes them', { default: 'pulled from a host into the cache' }),
});

/** The format a model's matrices are held in. */
export const FORMAT = group('format', {
  dtype: choice(['f32', 'bf16'], 'hold the model\'s matrices in this float format', { default: 'f32' }),
  quantize: choice(['int8', 'int4'], 'hold the model\'s matrices in blocks of 32 (llama.cpp\'s Q8_0, Q4_0)'),
});

/** How a job checks its workers. */
export const VERIFICATION = group('verification', {
  'redundancy': int('K', 'run each section on K workers and compare their results bit for bit (js)', { default: 1 }),
  'verify-rate': num('P', 'the share of records, within [0, 1], the validator re-runs', { default: 0.05 }),
  'verify': choice(['commit', 'exact'], 'how decoding is checked: commit (activation commitments of sampled chunks, one prefill at the validator) or exact (sampled steps re-run, bit for bit on js)', { default: 'commit' }),
  'chunk-rate': num('P', 'the share of the chunks of 32 positions hosts and workers commit to that the validator checks', { default: 0.37 }),
});

/** A node's chain (an Ethereum JSON-RPC endpoint and the deployed contracts). */
export const CHAIN = group('chain', {
  contracts: str('FILE', 'join the chain of this deployment (what tensorlink chain --out FILE wrote)'),
  rpc: str('URL', 'the chain\'s Ethereum JSON-RPC endpoint', { default: 'the deployment\'s' }),
});

/** What a user's job pays into escrow (with --contracts). */
export const PAY = group('chain', {
  ...CHAIN,
  pay: str('TLK', 'tokens paid into the job\'s escrow from ~/.tensorlink/user', { default: 10 }),
});

/** What a long-running node (validator, worker) takes. */
export const NODE = group('node', {
  'data': str('DIR', 'where the node keeps its key, its account and its state', { default: 'nothing kept' }),
  'announce': repeatable('MULTIADDR', 'an address to announce besides the interfaces\' (without /p2p/)'),
  'log-level': choice(LOG_LEVELS, 'what the node logs on stderr', { default: 'warn' }),
  'parent-pid': int('PID', 'stop when that process is gone (set by a local swarm)'),
});
