import { validatorsFlag } from './node-process.ts';
import { createNode } from '../../p2p/index.ts';
import { type Flags, requiredString, stringFlag, UsageError } from '../args.ts';
import { bar, type Output } from '../output.ts';

/**
 * `tensorlink pull-ends NAME --bootstrap ADDR --out DIR [--hash H]`: a hosted model's ends (embedding, final norm, head),
 * config and tokenizer, fetched from one of its hosts and checked against the model's hash (its weights and files), into DIR: what
 * `generate --model NAME --ends DIR` and `serve --model NAME --ends DIR` read.
 */
export async function pullEndsCommand(flags: Flags, out: Output, positionals: string[] = []): Promise<void> {
  const [name, ...extra] = positionals;
  if (!name) throw new UsageError('pull-ends needs the NAME of a hosted model (see tensorlink models --bootstrap ADDR)');
  if (extra.length > 0) throw new UsageError(`pull-ends takes one NAME, not '${positionals.join(' ')}'`);
  const bootstrap = requiredString(flags, 'bootstrap');
  const dir = requiredString(flags, 'out');
  const hash = stringFlag(flags, 'hash');
  if (hash !== undefined && !/^[0-9a-f]{4,64}$/.test(hash)) throw new UsageError(`--hash must be (a prefix of) a model's hash in hex, got '${hash}'`);
  const validator = validatorsFlag(bootstrap);
  const listen = stringFlag(flags, 'listen');
  const node = await createNode(listen ? { listen: [listen] } : {});
  const { pullEnds } = await import('../../user/index.ts');
  const started = performance.now();
  try {
    const pulled = await pullEnds(node, validator, name, dir, {
      ...(hash === undefined ? {} : { hash }),
      onProgress: (done, total) => out.progress(`${bar(done / Math.max(1, total))} ${(done / 2 ** 20).toFixed(1)} of ${(total / 2 ** 20).toFixed(1)} MiB of ends`),
    });
    const seconds = (performance.now() - started) / 1000;
    const mib = (pulled.bytes / 2 ** 20).toFixed(1);
    out.result({ ...pulled, seconds }, `${name} (${pulled.hash.slice(0, 12)}…): its ends (${mib} MiB), config and tokenizer from `
    + `…${pulled.host.slice(-8)} in ${dir}, checked against its hash (${seconds.toFixed(1)} s)`);
  } finally {
    await node.stop();
  }
}
