import '../polyfills.ts';
import { type ParseArgsConfig, parseArgs } from 'node:util';
import { TensorLinkError } from '../errors.ts';
import { setBackend } from '../tensor/index.ts';
import { runEngineDemo } from './engine-demo.ts';
import { bar, createOutput } from './output.ts';

/** A command line that cannot be run as written (unknown command or flag, bad value). */
export class UsageError extends TensorLinkError {
  constructor(message: string) {
    super(message);
    this.name = 'UsageError';
  }
}

const HELP = `tensorlink: decentralized training and inference of neural networks

usage: tensorlink <command> [options]

commands:
  demo [--steps N] [--seed S] [--backend js|ort] [--json]
      the showcase: a network learns 2-digit addition with the engine (autograd + AdamW)
      and is scored on 2000 sums it never saw. The distributed demo (a local swarm)
      replaces it when distributed training lands.

planned (not in this version): init-model, generate, train, validator, worker, status

every command takes --json (one JSON object on stdout) and --help`;

type Flags = Record<string, string | boolean | undefined>;

function intFlag(flags: Flags, name: string, fallback: number, min = 1): number {
  const raw = flags[name];
  if (raw === undefined) return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min)
    throw new UsageError(`--${name} must be an integer ≥ ${min}, got '${raw}'`);
  return n;
}

function demo(flags: Flags): void {
  const out = createOutput(flags.json === true);
  const steps = intFlag(flags, 'steps', 800);
  const seed = intFlag(flags, 'seed', 1, 0);
  if (flags.backend !== undefined) {
    if (flags.backend !== 'js' && flags.backend !== 'ort')
      throw new UsageError(`--backend must be js or ort`);
    setBackend(flags.backend);
  }
  out.info(`TensorLink engine demo: learning 2-digit addition (${steps} steps, seed ${seed})`);
  const result = runEngineDemo({
    steps,
    batch: 128,
    seed,
    onProgress: (step, loss, lr) => {
      out.progress(
        `${bar(step / steps)} step ${step}/${steps}  loss ${loss.toFixed(4)}  lr ${lr.toExponential(2)}`,
      );
      if (step % Math.max(1, Math.floor(steps / 4)) === 0 || step === steps) {
        out.info(`step ${String(step).padStart(5)}  loss ${loss.toFixed(4)}`);
      }
    },
  });
  const lines = [
    ...result.examples.map(
      (e) =>
        `  ${e.question.padStart(6)} = ${String(e.predicted).padEnd(4)} ${e.predicted === e.answer ? 'right' : `wrong (${e.answer})`}`,
    ),
    `exact match on ${result.heldOut} held-out sums: ${(100 * result.accuracy).toFixed(1)}%`,
    `${result.parameters} parameters, ${result.steps} steps in ${result.seconds.toFixed(1)} s on the ${result.backend} backend`,
  ];
  out.result(result, lines.join('\n'));
}

interface Command {
  options: NonNullable<ParseArgsConfig['options']>;
  run: (flags: Flags) => void | Promise<void>;
}

const COMMANDS: Record<string, Command> = {
  demo: {
    options: { steps: { type: 'string' }, seed: { type: 'string' }, backend: { type: 'string' } },
    run: demo,
  },
};

const PLANNED = new Set(['init-model', 'generate', 'train', 'validator', 'worker', 'status']);

/** Runs the CLI; returns the exit code. User errors print one line, never a stack trace. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
      process.stdout.write(`${HELP}\n`);
      return command === undefined ? 2 : 0;
    }
    if (PLANNED.has(command)) {
      throw new UsageError(`'${command}' is not available in this version yet (see the README's roadmap)`);
    }
    const spec = COMMANDS[command];
    if (spec === undefined) throw new UsageError(`unknown command '${command}' (try --help)`);
    let flags: Flags;
    try {
      flags = parseArgs({
        args: rest,
        options: { ...spec.options, json: { type: 'boolean' }, help: { type: 'boolean' } },
        strict: true,
        allowPositionals: false,
      }).values as Flags;
    } catch (err) {
      throw new UsageError((err as Error).message);
    }
    if (flags.help) {
      process.stdout.write(`${HELP}\n`);
      return 0;
    }
    await spec.run(flags);
    return 0;
  } catch (err) {
    if (err instanceof TensorLinkError) {
      process.stderr.write(`tensorlink: ${err.message}\n`);
      return err instanceof UsageError ? 2 : 1;
    }
    throw err;
  }
}

process.exitCode = await main(process.argv.slice(2));
