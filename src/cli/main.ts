import '../polyfills.ts';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { TensorLinkError } from '../errors.ts';
import { setBackend } from '../tensor/index.ts';
import { type Flags, optionalIntFlag, UsageError } from './args.ts';
import { readFileSync } from 'node:fs';
import { createOutput, type Output } from './output.ts';

const HELP = `tensorlink: decentralized training and inference of neural networks

usage: tensorlink <command> [options]

commands:
  demo [--steps N --seed S --workers N --micro-batches M --schedule gpipe|1f1b --cheat KIND|none --verify-rate P]
      the main job on a local swarm: a validator and 3 honest workers and one that cheats (own
      processes) train a transformer, split across the workers, on 2-digit addition while the
      validator re-runs a sample of their signed computations; the cheater is caught and excluded;
      then the swarm answers held-out sums
  init-model --arch gpt2|llama|mistral|qwen2|qwen3|phi3|gemma2|gemma3_text|mixtral|qwen3_moe|gpt_neox|falcon|bloom
             [--layers N --hidden N --heads N --kv-heads N --intermediate N --vocab N --max-positions N
             --sliding-window N] --out DIR [--seed S] [--force]
      a new random model in Hugging Face layout (config.json, model.safetensors, tokenizer.json)
  convert --model DIR|FILE.gguf --out FILE.gguf|DIR [--type f32|f16|q8_0|q4_0] [--force]
      a Hugging Face directory to a GGUF file llama.cpp runs (its tokenizer too), or a GGUF file (llama,
      mistral, qwen2, qwen3) to a Hugging Face directory; every --model DIR also takes a .gguf file
  merge --model DIR --adapter DIR --out DIR [--force]
      the model with a PEFT LoRA adapter folded into its weights, in the Hub's layout
  generate --model DIR --prompt TEXT [--max-new-tokens N --temperature T --top-k K --top-p P --seed S]
           [--local N | --bootstrap MULTIADDR [--listen MULTIADDR]] [--strategy S --privacy ends|none]
           [--redundancy K --verify-rate P] [--contracts FILE [--rpc URL] --pay TLK] [--dtype f32|bf16 --quantize int8|int4]
      continues the prompt, streaming tokens as they come; --local 0 (default) in this process,
      --local N on a local swarm of N workers, --bootstrap on an existing swarm; --dtype bf16 or --quantize
      holds the model's matrices compact (bf16; int8 and int4 blocks of 32, llama.cpp's Q8_0 and Q4_0), the workers' too
      --adapter DIR: through a PEFT LoRA adapter (in this process, or on every worker of the job)
  generate --model NAME --bootstrap MULTIADDR [--ends DIR] --prompt TEXT [...]
      from a model the swarm hosts (a --model that is no path here is a hosted model's name): this
      process holds only its ends (embedding, final norm, head, tokenizer), read from DIR, or without
      --ends pulled from a host once (as pull-ends does) into the cache (~/.cache/tensorlink/ends/HASH)
  serve --model DIR [--name ID] [--port P (default 8000) --host H (default 127.0.0.1)]
        [--local N | --bootstrap MULTIADDR [--listen MULTIADDR]] [--strategy S --privacy ends|none]
      an OpenAI-compatible HTTP API over the model (GET /v1/models, POST /v1/completions and
      /v1/chat/completions, streamed or not); --local 0 (default) in this process, --local N on a
      local swarm of N workers, --bootstrap on an existing swarm; requests decode in batches of up
      to 8 rows, in the order they came; prints {"event":"ready","url",...,"model"} when it listens;
      the dashboard is at / (the swarm's, with this server's figures) and Prometheus metrics at /metrics;
      --adapter NAME=DIR (repeatable, in this process): a request whose model is 'ID:NAME' runs through
      that PEFT adapter (one base in memory; a batch runs one adapter)
  serve --model NAME --bootstrap MULTIADDR [--ends DIR] [...]
      the API over a model the swarm hosts: this process holds its ends for all its clients (without
      --ends, pulled from a host once into the cache, as generate does)
  train --model DIR (--data FILE|fortunes | --task addition|addition-padded|reverse) --steps N [--batch B --lr X --seq-len T
        --micro-batches M --eval-every N --eval-size N --seed S --out DIR --resume --stop-at N]
        [--local N | --bootstrap MULTIADDR [--listen MULTIADDR]]
        [--schedule gpipe|1f1b --replicas R --strategy S --privacy ends|none] [--redundancy K --verify-rate P --snapshot-every N]
        [--compress-grads dct-topk[:k=N,chunk=N,bits=N] --sync-every N] [--compress-activations fp16|int8]
        [--contracts FILE [--rpc URL] --pay TLK]   (pays TLK, default 10, into the job's escrow from ~/.tensorlink/user)
        [--adapter lora[:r=8,alpha=16,targets=q_proj,v_proj,...]|DIR [--quantize int4 --dtype bf16]]
      --adapter trains a LoRA adapter over the frozen model (compact with --quantize/--dtype: QLoRA), in
      this process or across workers (each holds its section's factors; only they train); its
      checkpoint in --out is the adapter in PEFT's layout;
      trains with progress, periodic evaluation and checkpoints (--resume continues one); across
      workers the model is split into stages, micro-batches flow through a GPipe or 1F1B schedule;
      every worker result comes with a signed record: --redundancy K runs each section on K workers
      and compares them bit for bit (js), --verify-rate P (default 0.05) has the validator re-run
      that share of records; a worker caught is flagged, excluded, and its work redone; a worker
      lost (dead, or past its deadline) is replaced: the job is rebuilt from its last copy (taken
      every 30 s, or every --snapshot-every N steps) and the steps since are replayed;
      activations go worker to worker; --compress-grads has replicas exchange DCT top-k gradients
      (default k=32, chunk=64, bits=8) with error feedback; --sync-every N has replicas take N local
      steps and then average their weights' changes (compressed too when --compress-grads is given:
      dct-topk:k=256 --sync-every 8 sends about 180× fewer bytes); --compress-activations sends hops as
      fp16 or int8; --data fortunes trains on Debian's fortunes (held-out loss and perplexity);
      --json adds "bytes": {activations, gradients, weights, control}

  validator [--listen MULTIADDR] [--data DIR] [--peers MULTIADDR,... --validators ID,... --threshold M]
            [--contracts FILE [--rpc URL]] [--dashboard [HOST:]PORT|auto] [--log-level debug|info|warn|error]
      a bootstrap peer, DHT server and registry of workers; prints {"event":"ready",...} when up;
      --dashboard serves the swarm's live web dashboard (and /metrics) there (port 0: any free port;
      auto: 8080, or any free port when that one is taken);
      keeps the ledger under DIR, its blocks co-signed (M signatures each, default 1) by the validator
      set: this one, those of --peers (which it dials) and those of --validators (which dial it)
  worker --bootstrap MULTIADDR [--memory 4GiB] [--data DIR] [--models DIR] [--listen MULTIADDR] [--log-level L]
         [--host [NAME=]DIR|FILE.gguf[:FIRST-LAST]]... [--host-auto] [--dtype bf16 | --quantize int8|int4]
         [--fault noise|skip|stale|scale-grad|zero|replay|free-ride|slow[:RATE]] [--contracts FILE [--rpc URL]]
         [--max-requests N]
      lends this machine's compute: measures it, announces it and keeps announcing while alive;
      --host serves blocks FIRST-LAST (from 0; default all) of a model on its disk to anyone, under
      NAME (default: the folder's or file's name), held in --dtype/--quantize; --host-auto chooses
      among the checkpoints under --models the blocks the swarm serves least, as many as fit
      --memory, and moves when the swarm's weakest block would gain a third;
      --max-requests: stage requests one peer may send per second before it is refused (default 5000);
      --fault makes it cheat (or, slow, stall 120 s) on a share RATE of its computations, only to
      test the network's defences
  status --bootstrap MULTIADDR
      the swarm as its validator sees it: peers, roles, capabilities, tiers, reputation (checks passed
      and failed, excluded), the sections each worker holds (layers, format, bytes), last seen
  models --bootstrap MULTIADDR [--page N]
      the models workers host (worker --host), each with its hash, blocks, coverage and hosts
  pull-ends NAME --bootstrap MULTIADDR --out DIR [--hash H]
      a hosted model's ends (embedding, final norm, head), config and tokenizer from one of its hosts
      into DIR (a new directory), checked against the model's manifest hash chunk by chunk
  swarm [--workers N] [--memory SIZE] [--contracts FILE [--rpc URL] | --no-chain] [--dashboard [HOST:]PORT | --no-dashboard]
      a local swarm: a validator and N workers on 127.0.0.1, each its own process, and a local
      chain (anvil) with the contracts deployed and the workers staked, until Ctrl-C; --contracts
      joins a chain that runs elsewhere instead, --no-chain runs without one; the validator serves
      the live dashboard on port 8080 (any free port if that one is taken), named in the ready line
  chain [--rpc URL] [--out FILE] [--validators ADDR,... --threshold M] [--key 0xKEY]
      without --rpc, starts a local Ethereum node (anvil, from npm) on a free loopback port until
      Ctrl-C; deploys the token, staking, escrow and settlement contracts (or finds them where FILE
      says), prints {"event":"ready","rpc",...,"contracts"} and writes the deployment to FILE;
      the validators' multisig is --validators (default: anvil's second account), --threshold of them
  account --data DIR [--contracts FILE [--rpc URL]]
      the Ethereum account a node started with --data DIR uses (its key is made there now if it is
      not yet): what chain --validators and fund take; with --contracts, its ether, tokens and stake
  fund ADDRESS... [--amount N (TLK, default 1000) --gas N (ether, default 1)] --contracts FILE [--rpc URL] [--key 0xKEY]
      sends tokens and gas money to the accounts, from --key (or TENSORLINK_DEPLOYER_KEY; on anvil,
      its first account, which deployed the contracts and holds the supply)
  stake [--amount N] --data DIR --contracts FILE [--rpc URL]
      locks N TLK of the account under DIR as stake (default: what it lacks of the 100 TLK a worker
      needs); a running worker also stakes by itself at its next announcement once it holds tokens
  ledger show [--height N] --bootstrap MULTIADDR
      the validator's ledger: blocks, records, each worker's accepted FLOPs; or block N's header,
      signers and records (with their ids)
  ledger proof RECORD-ID --bootstrap MULTIADDR [--out FILE]
      the record's inclusion proof (its Merkle path and the signed header), for ledger verify
  ledger verify PROOF-FILE [--threshold M --validators ID,...]
      checks offline that a record is in the ledger: signed by its worker, its Merkle path leads to
      the block header's root, and M validators (of --validators, if given) signed the header
  ledger settle --bootstrap MULTIADDR
      closes the epoch: the validators post its reward root on the chain and print who earns what;
      workers claim their rewards by themselves

every command takes --json (one JSON object on stdout; progress on stderr), --backend js|ort
(js: bitwise reproducible; ort: fast, the default where it loads), --threads N (onnxruntime
threads, idle ones sleeping: for nodes that share a machine) and --help`;

/** A command as its module gives it: its flags, and what runs it. */
interface Command {
  options: NonNullable<ParseArgsConfig['options']>;
  run: (flags: Flags, out: Output, positionals: string[]) => Promise<void>;
}

/**
 * Each command's module is loaded only when that command runs: a worker process does not load
 * the HTTP server, the tokenizers or the chain client it never uses (about a second of CPU at
 * every start). `positionals`: the command takes words after its name (`ledger verify FILE`).
 */
const COMMANDS: Record<string, { load: () => Promise<Command>; positionals?: boolean }> = {
  'demo': { load: () => import('./commands/demo.ts').then((m) => ({ options: m.demoOptions, run: m.demoCommand })) },
  'init-model': { load: () => import('./commands/init-model.ts').then((m) => ({ options: m.initModelOptions, run: m.initModel })) },
  'convert': { load: () => import('./commands/convert.ts').then((m) => ({ options: m.convertOptions, run: m.convertCommand })) },
  'merge': { load: () => import('./commands/merge.ts').then((m) => ({ options: m.mergeOptions, run: m.mergeCommand })) },
  'generate': { load: () => import('./commands/generate.ts').then((m) => ({ options: m.generateOptions, run: m.generateCommand })) },
  'train': { load: () => import('./commands/train.ts').then((m) => ({ options: m.trainOptions, run: m.trainCommand })) },
  'serve': { load: () => import('./commands/serve.ts').then((m) => ({ options: m.serveOptions, run: m.serveCommand })) },
  'validator': { load: () => import('./commands/nodes.ts').then((m) => ({ options: m.validatorOptions, run: m.validatorCommand })) },
  'worker': { load: () => import('./commands/worker.ts').then((m) => ({ options: m.workerOptions, run: m.workerCommand })) },
  'status': { load: () => import('./commands/nodes.ts').then((m) => ({ options: m.statusOptions, run: m.statusCommand })) },
  'models': { load: () => import('./commands/nodes.ts').then((m) => ({ options: m.modelsOptions, run: m.modelsCommand })) },
  'pull-ends': {
    load: () => import('./commands/pull-ends.ts').then((m) => ({ options: m.pullEndsOptions, run: m.pullEndsCommand })), positionals: true,
  },
  'swarm': { load: () => import('./commands/nodes.ts').then((m) => ({ options: m.swarmOptions, run: m.swarmCommand })) },
  'chain': { load: () => import('./commands/chain.ts').then((m) => ({ options: m.chainOptions, run: m.chainCommand })) },
  'ledger': { load: () => import('./commands/ledger.ts').then((m) => ({ options: m.ledgerOptions, run: m.ledgerCommand })), positionals: true },
  'account': { load: () => import('./commands/operator.ts').then((m) => ({ options: m.accountOptions, run: m.accountCommand })) },
  'stake': { load: () => import('./commands/operator.ts').then((m) => ({ options: m.stakeOptions, run: m.stakeCommand })) },
  'fund': { load: () => import('./commands/operator.ts').then((m) => ({ options: m.fundOptions, run: m.fundCommand })), positionals: true },
};

const PLANNED = new Set<string>();

/** The version of this package (package.json, two folders up from this file in src/ and in dist/). */
export function version(): string {
  return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
}

/**
 * One command's part of HELP: its usage lines and description (every form of it, as
 * `ledger show` and `ledger proof`), then the options every command takes.
 */
export function commandHelp(command: string): string {
  const lines = HELP.split('\n');
  const start = lines.findIndex((l) => l === 'commands:');
  const own: string[] = [];
  let inside = false;
  const end = lines.findIndex((l) => l.startsWith('every command takes'));
  for (const line of lines.slice(start + 1, end)) {
    // a command's first line is indented by two spaces, its continuation and description by more
    if (/^ {2}\S/.test(line)) inside = line.slice(2).split(' ')[0] === command;
    if (inside) own.push(line);
  }
  while (own.at(-1) === '') own.pop();
  return [`usage: tensorlink ${command} [options]`, '', ...own, '', ...lines.slice(end)].join('\n');
}

/** Runs the CLI; returns the exit code. User errors print one line, never a stack trace. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
      process.stdout.write(`${HELP}\n`);
      return command === undefined ? 2 : 0;
    }
    if (command === '--version' || command === '-v') {
      process.stdout.write(`${version()}\n`);
      return 0;
    }
    if (PLANNED.has(command)) throw new UsageError(`'${command}' is not available in this version yet (see the README's roadmap)`);
    const entry = Object.hasOwn(COMMANDS, command) ? COMMANDS[command] : undefined;
    if (entry === undefined) throw new UsageError(`unknown command '${command}' (try --help)`);
    const spec = await entry.load();
    let flags: Flags;
    let positionals: string[];
    try {
      ({ values: flags, positionals } = parseArgs({
        args: rest,
        options: { ...spec.options, json: { type: 'boolean' }, help: { type: 'boolean' }, backend: { type: 'string' }, threads: { type: 'string' } },
        strict: true,
        allowPositionals: entry.positionals === true,
      }) as { values: Flags; positionals: string[] });
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    if (flags.help) {
      process.stdout.write(`${commandHelp(command)}\n`);
      return 0;
    }
    if (flags.backend !== undefined && flags.backend !== 'js' && flags.backend !== 'ort') throw new UsageError('--backend must be js or ort');
    const threads = optionalIntFlag(flags, 'threads', 1);
    if (flags.backend === 'js') setBackend('js');
    else if (flags.backend === 'ort' || threads !== undefined) {
      // --threads N: onnxruntime on N threads that sleep when idle (nodes sharing a machine)
      try {
        setBackend('ort', threads === undefined ? {} : { threads, spinning: false });
      } catch (err) {
        if (flags.backend === 'ort') throw err;
      }
    }
    await spec.run(flags, createOutput(flags.json === true), positionals);
    return 0;
  } catch (err) {
    if (err instanceof TensorLinkError) {
      process.stderr.write(`tensorlink: ${err.message}\n`);
      return err instanceof UsageError ? 2 : 1;
    }
    throw err;
  }
}

const code = await main(process.argv.slice(2));
// The command is done: the process ends now, even where a native library still holds a thread (WebRTC's libdatachannel
// after a connection attempt that failed kept `generate` alive once its tokens were out). What was written goes first.
await new Promise((resolve) => process.stdout.write('', resolve));
await new Promise((resolve) => process.stderr.write('', resolve));
process.exit(code);
