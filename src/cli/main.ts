import '../polyfills.ts';
import './heap.ts';
import { TensorLinkError } from '../errors.ts';
import { backendDevice, loadBackend, setBackend, setComputeDevice } from '../tensor/index.ts';
import { optionalIntFlag, UsageError } from './args.ts';
import { readFileSync } from 'node:fs';
import { commandHelp, overviewHelp } from './help.ts';
import { createOutput } from './output.ts';
import { parseCommand } from './parse.ts';
import { commandSpec, resolveCommand } from './spec.ts';

const PLANNED = new Set<string>();

/** The version of this package (package.json, two folders up from this file in src/ and in dist/). */
export function version(): string {
  return (JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version: string }).version;
}

/** Runs the CLI; returns the exit code. User errors print one line, never a stack trace. */
export async function main(argv: string[]): Promise<number> {
  const [command, ...rest] = argv;
  try {
    if (command === undefined || command === '--help' || command === '-h' || command === 'help') {
      process.stdout.write(`${overviewHelp()}\n`);
      return command === undefined ? 2 : 0;
    }
    if (command === '--version' || command === '-v') {
      process.stdout.write(`${version()}\n`);
      return 0;
    }
    if (PLANNED.has(command)) throw new UsageError(`'${command}' is not available in this version yet (see the README's roadmap)`);
    const declared = commandSpec(command);
    if (declared === undefined) throw new UsageError(`unknown command '${command}' (try --help)`);
    const spec = await resolveCommand(declared);
    // the line is checked against the declaration before the command's code loads
    const { flags, positionals } = parseCommand(spec, rest);
    if (flags.help) {
      process.stdout.write(`${commandHelp(spec)}\n`);
      return 0;
    }
    const threads = optionalIntFlag(flags, 'threads', 1);
    // a device backend (webgpu) runs the model's steps; the host's work stays on the CPU context (ort where it loads)
    const onDevice = typeof flags.backend === 'string' && backendDevice(loadBackend(flags.backend)) !== 'cpu';
    if (onDevice) setComputeDevice(flags.backend as string);
    if (typeof flags.backend === 'string' && flags.backend !== 'ort' && !onDevice) setBackend(flags.backend);
    else if (flags.backend === 'ort' || onDevice || threads !== undefined) {
      // --threads N: onnxruntime on N threads that sleep when idle (nodes sharing a machine)
      try {
        setBackend('ort', threads === undefined ? {} : { threads, spinning: false });
      } catch (err) {
        if (flags.backend === 'ort') throw err;
        if (onDevice) setBackend('js');
      }
    }
    const run = await spec.load();
    await run(flags, createOutput(flags.json === true), positionals);
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
