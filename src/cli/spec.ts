/**
 * Every `tensorlink` command, declared: its name, what it does (a summary line for the overview, a few lines for its own
 * help), the words it takes after its name, its options (groups of options.ts and its own), and how its code loads.
 * A command's module is imported only when that command runs (a worker process does not load the HTTP server, the
 * tokenizers or the chain client it never uses: about a second of CPU at every start), so this module imports no
 * command's code: only the declarations.
 */
import type { Flags } from './args.ts';
import {
  bytes, CHAIN, choice, FORMAT, flag, int, lazyChoice, list, MODEL, NETWORK, NODE, num, type Options, OUTPUT, PAY, PLAN, repeatable,
  SPECULATIVE, str, VERIFICATION, withSpec,
} from './options.ts';
import type { Output } from './output.ts';

/** What runs a command: its flags (checked against its declaration), where it prints, and the words after its name. */
export type RunCommand = (flags: Flags, out: Output, positionals: string[]) => Promise<void>;

export interface CommandSpec {
  name: string;
  /** One line for `tensorlink --help`. */
  summary: string;
  /** More lines for `tensorlink NAME --help`. */
  description?: string[];
  /** The forms of the words after the name (`ledger show`, `ledger proof RECORD-ID`), each with one line; none: it takes no words. */
  positionals?: { usage: string; help: string }[];
  /** Every option it takes besides OUTPUT (which every command takes). */
  options: Options;
  /** Imports the command's module (only when it runs). */
  load: () => Promise<RunCommand>;
}

/** The architectures `init-model --arch` writes: the model-family registry's names (loaded with init-model only). */
const archs = () => import('../models/index.ts').then((m) => m.familyNames());

const seed = (fallback: number) => int('S', 'the seed of the random numbers (same seed, same run)', { min: 0, default: fallback });
const force = flag('replace what is at --out');
const steps = (extra: { default?: number }) => int('N', 'training steps', extra);
const microBatches = int('M', 'micro-batches per step, through the pipeline', { default: 1 });
const schedule = choice(['gpipe', '1f1b'], 'the pipeline schedule of the micro-batches', { default: '1f1b' });
const dashboard = str('[HOST:]PORT|auto', 'serve the swarm\'s live web dashboard (and /metrics) there; port 0: any free port; auto: 8080, or any free port');
const threshold = int('M', 'signatures a block of the ledger needs, of the validator set', { default: 1 });
const amount = (help: string, fallback: string) => str('N', help, { default: fallback });
const page = int('N', 'only that page (the "next" of an earlier answer)', { min: 0, default: 'every page' });
const key = str('0xKEY', 'the deployer\'s private key', { default: 'TENSORLINK_DEPLOYER_KEY, or anvil\'s first account' });

export const COMMANDS: readonly CommandSpec[] = [
  {
    name: 'demo',
    summary: 'the main job on a local swarm: workers train a transformer to add, a validator catches the one that cheats',
    description: [
      'a validator and 3 honest workers and one that cheats (each its own process) train a transformer, split across',
      'the workers, on 2-digit addition while the validator re-runs a sample of their signed computations; the cheater',
      'is caught and excluded; then the swarm answers held-out sums',
    ],
    options: {
      'steps': steps({ default: 600 }),
      'seed': seed(1),
      'workers': int('N', 'honest workers', { default: 3 }),
      'micro-batches': withSpec(microBatches, { default: 2 }),
      schedule,
      'cheat': str('KIND|none', 'how the extra worker cheats (a worker --fault kind), or none for an honest swarm', { default: 'noise' }),
      ...VERIFICATION,
      'verify-rate': withSpec(VERIFICATION['verify-rate'], { default: '0.02 (0 with --cheat none)' }),
    },
    load: () => import('./commands/demo.ts').then((m) => m.demoCommand),
  },
  {
    name: 'init-model',
    summary: 'a new random model in Hugging Face layout (config.json, model.safetensors, tokenizer.json)',
    options: {
      'arch': lazyChoice('ARCH', archs, 'the architecture: a family of the registry (its Hugging Face model_type)', { default: 'gpt2' }),
      'layers': int('N', 'blocks', { default: 4 }),
      'hidden': int('N', 'the width of the hidden states', { default: 128 }),
      'heads': int('N', 'attention heads', { default: 4 }),
      'kv-heads': int('N', 'key/value heads (grouped-query attention)', { default: 'as many as --heads' }),
      'intermediate': int('N', 'the width of the MLP (of each expert, for the MoE families)', { default: 'the family\'s multiple of --hidden' }),
      'vocab': int('N', 'the vocabulary, at least the byte-level tokenizer\'s 257', { default: 257 }),
      'max-positions': int('N', 'the longest sequence', { default: 256 }),
      'sliding-window': int('N', 'attention looks back N tokens at most (the families on the shared decoder)', { default: 'the family\'s own (none for most)' }),
      'seed': seed(0),
      'out': str('DIR', 'where to write the model (a new or empty directory)'),
      force,
    },
    load: () => import('./commands/init-model.ts').then((m) => m.initModel),
  },
  {
    name: 'convert',
    summary: 'a Hugging Face directory to a GGUF file llama.cpp runs, or a GGUF file to a Hugging Face directory',
    description: ['the tokenizer goes with the weights (a GGUF file of a family whose GGUF names the registry holds); every --model DIR also takes a .gguf file'],
    options: {
      model: withSpec(MODEL.model, { value: 'DIR|FILE.gguf', help: 'the model to convert' }),
      out: str('FILE.gguf|DIR', 'what to write: a .gguf file from a directory, a directory from a .gguf file'),
      type: choice(['f32', 'f16', 'q8_0', 'q4_0'], 'the GGUF file\'s tensor type', { default: 'f32' }),
      force,
    },
    load: () => import('./commands/convert.ts').then((m) => m.convertCommand),
  },
  {
    name: 'merge',
    summary: 'the model with a PEFT LoRA adapter folded into its weights, in the Hub\'s layout',
    options: {
      model: MODEL.model,
      adapter: str('DIR', 'the PEFT LoRA adapter folder'),
      out: str('DIR', 'where to write the merged model'),
      force,
    },
    load: () => import('./commands/merge.ts').then((m) => m.mergeCommand),
  },
  {
    name: 'generate',
    summary: 'continues a prompt, streaming tokens as they come: in this process, on a local swarm, or on a swarm',
    description: [
      '--local 0 (default) in this process, --local N on a local swarm of N workers, --bootstrap on an existing swarm;',
      'a --model that is no path here is the name of a model the swarm hosts (worker --host): this process holds only',
      'its ends, read from --ends DIR or pulled from a host once (as pull-ends does) into ~/.cache/tensorlink/ends/HASH',
    ],
    options: {
      'model': withSpec(MODEL.model, { value: 'DIR|FILE.gguf|NAME', help: 'the model: a checkpoint here, or the name of a model the swarm hosts' }),
      'prompt': str('TEXT', 'the text to continue'),
      'max-new-tokens': int('N', 'tokens to generate at most', { min: 0, default: 32 }),
      'temperature': num('T', 'sampling temperature; 0: the most likely token', { default: 0 }),
      'top-k': int('K', 'sample among the K most likely tokens', { min: 0, default: 'all' }),
      'top-p': num('P', 'sample among the most likely tokens that hold P of the probability, in (0, 1]', { default: 1 }),
      'seed': seed(0),
      'ends': MODEL.ends,
      'adapter': str('DIR', 'generate through a PEFT LoRA adapter (in this process, or on every worker of the job)'),
      ...SPECULATIVE,
      ...NETWORK,
      ...PLAN,
      ...VERIFICATION,
      ...PAY,
      ...FORMAT,
    },
    load: () => import('./commands/generate.ts').then((m) => m.generateCommand),
  },
  {
    name: 'train',
    summary: 'trains a model with progress, evaluation and checkpoints: in this process or split across workers',
    description: [
      'across workers the model is split into stages and micro-batches flow through a GPipe or 1F1B schedule; every',
      'worker result comes with a signed record, checked at --redundancy K and sampled at --verify-rate P; a worker',
      'caught is flagged, excluded and its work redone; a worker lost is replaced: the job is rebuilt from its last',
      'copy (every 30 s, or every --snapshot-every N steps) and the steps since are replayed; --json adds "bytes"',
    ],
    options: {
      'model': MODEL.model,
      'data': str('FILE|fortunes', 'train on a text file (held-out loss and perplexity), or on Debian\'s fortunes'),
      'task': str('NAME', 'train on a task with exact answers: addition, addition-padded or reverse'),
      'steps': steps({}),
      'batch': int('B', 'sequences per step', { default: 32 }),
      'seq-len': int('T', 'tokens per sequence of --data', { default: 'the model\'s positions, at most 128' }),
      'lr': num('X', 'the peak learning rate (AdamW, warmup and cosine decay)', { default: 1e-3 }),
      'eval-every': int('N', 'steps between evaluations (and checkpoints)', { default: 'a fifth of --steps' }),
      'eval-size': int('N', 'held-out examples of a task an evaluation scores', { default: 200 }),
      'seed': seed(0),
      'out': str('DIR', 'where checkpoints go (the weights, the optimizer state, where the run was); an adapter\'s in PEFT\'s layout'),
      'resume': flag('go on from the checkpoint in --out'),
      'stop-at': int('N', 'end after step N with a checkpoint, to be continued with --resume', { default: 'at --steps' }),
      'micro-batches': microBatches,
      schedule,
      'replicas': int('R', 'copies of each section, each taking a share of the micro-batches (data parallel)', { default: 1 }),
      'snapshot-every': int('N', 'steps between the copies of the job a failover rebuilds from', { min: 0, default: 'every 30 s' }),
      'compress-grads': str('dct-topk[:k=N,chunk=N,bits=N]', 'replicas exchange DCT top-k gradients with error feedback (k=32, chunk=64, bits=8)', { default: 'none' }),
      'sync-every': int('N', 'replicas take N local steps, then average their weights\' changes', { default: 1 }),
      'score': flag('with --sync-every N: score every replica\'s change on held-out data before each average; one scored out leaves the job'),
      'compress-activations': str('fp16|int8', 'hops carry activations and their gradients in this format', { default: 'none' }),
      'adapter': str('lora[:r=8,alpha=16,targets=…]|DIR', 'train a LoRA adapter over the frozen model (compact with --quantize/--dtype: QLoRA)'),
      ...NETWORK,
      ...PLAN,
      'strategy': withSpec(PLAN.strategy, { default: 'parameter-balanced' }),
      ...VERIFICATION,
      ...PAY,
      ...FORMAT,
    },
    load: () => import('./commands/train.ts').then((m) => m.trainCommand),
  },
  {
    name: 'serve',
    summary: 'an OpenAI-compatible HTTP API over a model, with the dashboard and Prometheus metrics',
    description: [
      'GET /v1/models, POST /v1/completions and /v1/chat/completions, streamed or not; requests decode in batches of up',
      'to 8 rows, in the order they came; prints {"event":"ready","url",...,"model"} when it listens; the dashboard is',
      'at / and Prometheus metrics at /metrics; a --model that is no path here is the name of a model the swarm hosts:',
      'this process holds its ends for all its clients',
    ],
    options: {
      model: withSpec(MODEL.model, { value: 'DIR|FILE.gguf|NAME', help: 'the model: a checkpoint here, or the name of a model the swarm hosts' }),
      name: str('ID', 'the model\'s id in the API', { default: 'the folder\'s name' }),
      port: int('P', 'the port to listen on, 0..65535 (0: any free port)', { min: 0, default: 8000 }),
      host: str('H', 'the address to listen on', { default: '127.0.0.1' }),
      ends: MODEL.ends,
      adapter: repeatable('NAME=DIR', 'a PEFT adapter a request\'s model \'ID:NAME\' runs through (in this process)'),
      ...SPECULATIVE,
      ...NETWORK,
      ...PLAN,
      ...VERIFICATION,
      ...FORMAT,
      ...PAY,
    },
    load: () => import('./commands/serve.ts').then((m) => m.serveCommand),
  },
  {
    name: 'validator',
    summary: 'a bootstrap peer, DHT server, registry of workers and keeper of the ledger',
    description: [
      'prints {"event":"ready",...} when up; keeps the ledger under --data, its blocks co-signed (--threshold M) by the',
      'validator set: this one, those of --peers (which it dials) and those of --validators (which dial it)',
    ],
    options: {
      listen: withSpec(NETWORK.listen, { help: 'where the validator listens', default: 'loopback, any free port' }),
      peers: list('MULTIADDR,...', 'the other validators to dial'),
      validators: list('ID,...', 'the peer ids of validators that dial this one'),
      threshold,
      dashboard,
      ...CHAIN,
      ...NODE,
    },
    load: () => import('./commands/nodes.ts').then((m) => m.validatorCommand),
  },
  {
    name: 'worker',
    summary: 'lends this machine\'s compute: measures it, announces it, serves sections of models',
    description: [
      '--host serves blocks FIRST-LAST (from 0; default all) of a model on its disk to anyone, under NAME (default: the',
      'folder\'s or file\'s name); --host-auto chooses among the checkpoints under --models the blocks the swarm serves',
      'least, as many as fit --memory, and moves when the swarm\'s weakest block would gain a third',
    ],
    options: {
      'bootstrap': NETWORK.bootstrap,
      'listen': withSpec(NETWORK.listen, { help: 'where the worker listens', default: 'loopback, any free port' }),
      'memory': bytes('memory this worker offers', { default: 'what the machine has free' }),
      'gpu-memory': bytes('with --backend webgpu: memory it lends on the GPU (a section must fit there and in --memory)', {
        default: 'as --memory',
      }),
      'models': str('DIR', 'checkpoints this worker holds: loads of them move no weights'),
      'store-max': bytes('weight chunks kept under --data for loads to come, at most (the least recently used go first)', { default: '20GiB' }),
      'host': repeatable('[NAME=]DIR|FILE.gguf[:FIRST-LAST]', 'serve these blocks of a model on this disk to anyone'),
      'host-auto': flag('host what the swarm lacks, among the checkpoints under --models'),
      'rebalance': int('SECONDS', 'with --host-auto: how often it checks whether moving would serve the swarm better (0: never)', {
        min: 0, default: 60,
      }),
      'fault': str('KIND[:RATE]', 'cheat (noise, skip, stale, scale-grad, zero, replay, free-ride) or stall (slow), only to test the network\'s defences'),
      'max-requests': int('N', 'stage requests one peer may send per second before it is refused', { default: 5000 }),
      ...FORMAT,
      ...CHAIN,
      ...NODE,
    },
    load: () => import('./commands/worker.ts').then((m) => m.workerCommand),
  },
  {
    name: 'status',
    summary: 'the swarm as its validator sees it: peers, roles, capabilities, reputation, the sections they hold',
    options: {
      bootstrap: NETWORK.bootstrap,
      page,
    },
    load: () => import('./commands/nodes.ts').then((m) => m.statusCommand),
  },
  {
    name: 'models',
    summary: 'the models workers host (worker --host), each with its hash, blocks, coverage and hosts',
    options: {
      bootstrap: NETWORK.bootstrap,
      page,
    },
    load: () => import('./commands/nodes.ts').then((m) => m.modelsCommand),
  },
  {
    name: 'pull-ends',
    summary: 'a hosted model\'s ends (embedding, final norm, head), config and tokenizer from one of its hosts',
    description: ['into DIR (a new directory), checked against the model\'s hash (its weights and the files beside them) chunk by chunk and file by file'],
    positionals: [{ usage: 'NAME', help: 'the hosted model (see tensorlink models)' }],
    options: {
      bootstrap: NETWORK.bootstrap,
      listen: NETWORK.listen,
      out: str('DIR', 'where to write the ends (a new directory)'),
      hash: str('H', 'the model\'s hash, or a prefix of it in hex (when several share the name)'),
    },
    load: () => import('./commands/pull-ends.ts').then((m) => m.pullEndsCommand),
  },
  {
    name: 'swarm',
    summary: 'a local swarm: a validator and N workers on 127.0.0.1, each its own process, and a local chain, until Ctrl-C',
    description: [
      'the chain is anvil with the contracts deployed and the workers staked; --contracts joins a chain that runs',
      'elsewhere instead, --no-chain runs without one; the validator serves the live dashboard, named in the ready line',
    ],
    options: {
      'workers': int('N', 'workers', { default: 3 }),
      'memory': bytes('memory each worker offers', { default: 'what the machine has free' }),
      'no-chain': flag('run without a chain'),
      'dashboard': withSpec(dashboard, { default: 'auto' }),
      'no-dashboard': flag('serve no dashboard'),
      ...CHAIN,
    },
    load: () => import('./commands/nodes.ts').then((m) => m.swarmCommand),
  },
  {
    name: 'chain',
    summary: 'a local Ethereum node (anvil) with the token, staking, escrow and settlement contracts deployed',
    description: [
      'without --rpc, starts anvil on a free loopback port until Ctrl-C; deploys the contracts (or finds them where',
      '--out says), prints {"event":"ready","rpc",...,"contracts"} and writes the deployment to --out',
    ],
    options: {
      'rpc': str('URL', 'deploy on this Ethereum JSON-RPC endpoint instead', { default: 'a local anvil' }),
      'out': str('FILE', 'where to write the deployment (what --contracts takes)'),
      'validators': list('ADDR,...', 'the validators\' multisig', { default: 'anvil\'s second account' }),
      'threshold': int('M', 'signatures of --validators a settlement needs', { default: 'a majority' }),
      key,
      'parent-pid': NODE['parent-pid'],
    },
    load: () => import('./commands/chain.ts').then((m) => m.chainCommand),
  },
  {
    name: 'rl',
    summary: 'reinforcement learning (GRPO): a policy samples completions, a task rewards them, the policy learns from the rewards',
    description: [
      'in this process on a checkpoint directory; with --bootstrap (or --local N) over a model its hosts serve for everyone',
      '(--model NAME: a LoRA adapter trained over the hosts, which generate the rollouts with it), or as a private job of',
      'a directory; --task addition, reverse, json, or FILE.mjs exporting reward(prompt, completion) and prompts',
    ],
    options: {
      'task': str('NAME|FILE.mjs', 'what the completions are rewarded for: addition, reverse, json, or a JS module of your own'),
      'model': str('DIR|NAME', 'the policy: a checkpoint directory, or (with --bootstrap) a hosted model\'s name'),
      'steps': steps({ default: 50 }),
      'prompts': int('P', 'prompts a step', { default: 8 }),
      'group': int('G', 'completions of each prompt, compared with each other (group-relative advantages)', { default: 8 }),
      'lr': num('X', 'the learning rate (AdamW, cosine to 10% over --steps)', { default: 1e-3 }),
      'preset': choice(['grpo', 'dr-grpo', 'dapo'], 'the objective: GRPO\'s, or Dr. GRPO\'s or DAPO\'s fixes', { default: 'grpo' }),
      'beta': num('B', 'the weight of the KL term to the starting policy (in this process) or to the model as its hosts serve it (a hosted model)', { default: 0 }),
      'overlap': flag('draw a step\'s rollouts before the last update (one step stale, importance-weighted); over a hosted model beside it, on a second job of the adapter'),
      'adapter': str('lora[:r=8,alpha=16,targets=…]', 'train a LoRA adapter over the frozen model', { default: 'lora:r=8 over a hosted model; else every weight' }),
      'eval-every': int('N', 'steps between held-out evaluations (greedy exact match)', { min: 0, default: 10 }),
      'eval-size': int('N', 'held-out examples an evaluation scores', { default: 200 }),
      'seed': seed(0),
      ...NETWORK,
      ...VERIFICATION,
      ...PAY,
    },
    load: () => import('./commands/rl.ts').then((m) => m.rlCommand),
  },
  {
    name: 'simulate',
    summary: 'a swarm of thousands of simulated peers in virtual time, run by the project\'s own registry, router, planner and pay',
    description: [
      'peers on a world map with fibre, cable and mobile links and GPUs, laptops and browser tabs, coming and going',
      '(Weibull lifetimes); hosted models and their sessions, private training jobs, cheaters; --json prints the report',
    ],
    options: {
      peers: int('N', 'simulated peers', { default: '10000' }),
      hours: num('H', 'virtual hours', { default: '1' }),
      seed: int('S', 'the scenario\'s seed', { default: '1', min: 0 }),
      lifetime: num('H', 'median hours a peer stays online', { default: '1' }),
      cheaters: num('SHARE', 'share of peers that cheat', { default: '0.02' }),
      svg: str('FILE', 'also draw the report over virtual time (sessions, peers online, coverage, catches) as an SVG'),
    },
    load: () => import('./commands/simulate.ts').then((m) => m.simulateCommand),
  },
  {
    name: 'ledger',
    summary: 'the validators\' ledger: its blocks, inclusion proofs checked offline, settling an epoch',
    positionals: [
      { usage: 'show', help: 'the ledger: blocks, records, each worker\'s accepted FLOPs; or (--height N) one block\'s header, signers and records' },
      { usage: 'proof RECORD-ID', help: 'the record\'s inclusion proof (its Merkle path and the signed header), for ledger verify' },
      { usage: 'verify PROOF-FILE', help: 'checks offline that a record is in the ledger: its worker\'s signature, its Merkle path, M validators\' signatures' },
      { usage: 'settle', help: 'closes the epoch: the validators post its reward root on the chain; workers claim by themselves' },
    ],
    options: {
      bootstrap: NETWORK.bootstrap,
      height: int('N', 'show that block', { min: 0 }),
      out: str('FILE', 'write the proof there'),
      threshold: withSpec(threshold, { help: 'validators\' signatures a proof needs' }),
      validators: list('ID,...', 'only these validators\' signatures count', { default: 'any' }),
    },
    load: () => import('./commands/ledger.ts').then((m) => m.ledgerCommand),
  },
  {
    name: 'account',
    summary: 'the Ethereum account a node started with --data DIR uses (its key made there if it is not yet)',
    description: ['what chain --validators and fund take; with --contracts, its ether, tokens and stake'],
    options: { data: withSpec(NODE.data, { help: 'the node\'s directory', default: undefined, group: undefined }), ...CHAIN },
    load: () => import('./commands/operator.ts').then((m) => m.accountCommand),
  },
  {
    name: 'fund',
    summary: 'sends tokens and gas money to accounts, from the deployer\'s key',
    positionals: [{ usage: 'ADDRESS...', help: 'the accounts to fund' }],
    options: {
      amount: amount('tokens (TLK) each account gets', '1000'),
      gas: amount('ether each account gets for gas', '1'),
      key,
      ...CHAIN,
    },
    load: () => import('./commands/operator.ts').then((m) => m.fundCommand),
  },
  {
    name: 'stake',
    summary: 'locks TLK of the account under --data DIR as stake (a running worker also stakes by itself)',
    options: {
      amount: amount('tokens (TLK) to stake', 'what the account lacks of the 100 TLK a worker needs'),
      data: withSpec(NODE.data, { help: 'the node\'s directory', default: undefined, group: undefined }),
      ...CHAIN,
    },
    load: () => import('./commands/operator.ts').then((m) => m.stakeCommand),
  },
];

/** The command named `name`, if there is one. */
export function commandSpec(name: string): CommandSpec | undefined {
  return COMMANDS.find((c) => c.name === name);
}

/**
 * The command with the values of its lazy enums read (`init-model --arch`: the model families), for parsing and help.
 * @example
 * const spec = await resolveCommand(commandSpec('init-model')!)
 */
export async function resolveCommand(command: CommandSpec): Promise<CommandSpec> {
  const lazy = Object.entries(command.options).filter(([, o]) => o.loadChoices !== undefined);
  if (lazy.length === 0) return command;
  const options = { ...command.options };
  for (const [name, o] of lazy) {
    const choices = await o.loadChoices!();
    options[name] = { ...o, choices, value: choices.join('|'), loadChoices: undefined };
  }
  return { ...command, options };
}

/** Every option `command` accepts: its own and its groups', and those every command takes. */
export function acceptedOptions(command: CommandSpec): Options {
  return { ...command.options, ...OUTPUT };
}
