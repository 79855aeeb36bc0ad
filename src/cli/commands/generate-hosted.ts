import { loadModel } from '../../models/index.ts';
import { type Flags, intFlag, numberFlag, optionalIntFlag, type Placement, stringFlag, UsageError, weightFlags } from '../args.ts';
import type { Output } from '../output.ts';

/**
 * `generate --model NAME --bootstrap ADDR --ends DIR`: generation from a model the swarm hosts (`worker --host`), by
 * name. The user holds only its ends, read from DIR (a checkpoint directory or GGUF file of the same model: only its
 * embedding, final norm and head are loaded), with the tokenizer; the blocks run on hosts that cover them.
 */
export async function generateHosted(name: string, prompt: string, where: Placement, flags: Flags, out: Output): Promise<void> {
  if (where.kind !== 'remote') throw new UsageError(`'${name}' is no file here: a hosted model is used with --bootstrap ADDR`);
  const endsDir = stringFlag(flags, 'ends');
  if (!endsDir) throw new UsageError(`generating from the hosted model '${name}' needs its ends: --ends DIR (a checkpoint or GGUF file of it)`);
  // the ends in the format the user asks (--dtype, --quantize), as its hosts hold the blocks in theirs
  const ends = await loadModel(endsDir, { part: 'ends', ...weightFlags(flags) });
  const tok = ends.tokenizer;
  if (!tok) throw new UsageError(`${endsDir} has no tokenizer; generate needs one to read the prompt`);
  const promptIds = tok.encode(prompt);
  if (promptIds.length === 0) throw new UsageError('the prompt encodes to no tokens');
  const maxNewTokens = Math.min(intFlag(flags, 'max-new-tokens', 32, 0), ends.config.maxPositions - promptIds.length);
  if (maxNewTokens < 0) throw new UsageError(`the prompt has ${promptIds.length} tokens, more than the model's ${ends.config.maxPositions} positions`);
  const [{ HostedModel }, { joinSwarm }] = await Promise.all([import('../../user/index.ts'), import('../swarm.ts')]);
  const access = await joinSwarm(where, flags);
  const started = performance.now();
  try {
    const model = await HostedModel.open(access.node, access.bootstrap, name, { ends });
    out.info(`${name} (${model.entry.hash.slice(0, 12)}…): ${model.entry.layers} blocks on ${new Set(model.entry.hosts.map((h) => h.peerId)).size} hosts`);
    let printed = '';
    const produced: number[] = [];
    try {
      const { tokens } = await model.generate(promptIds, {
        maxNewTokens,
        temperature: numberFlag(flags, 'temperature', 0),
        topK: optionalIntFlag(flags, 'top-k'),
        topP: numberFlag(flags, 'top-p', 1),
        seed: intFlag(flags, 'seed', 0, 0),
        onToken: (t) => {
          produced.push(t);
          const text = tok.decode(produced);
          if (!out.json && !text.endsWith('\uFFFD')) {
            process.stdout.write(text.slice(printed.length));
            printed = text;
          }
        },
      });
      const text = tok.decode(tokens);
      const seconds = (performance.now() - started) / 1000;
      if (out.json) out.result({ text, tokens, promptTokens: promptIds.length, seconds, model: { name, hash: model.entry.hash } }, '');
      else {
        process.stdout.write(`${text.slice(printed.length)}\n`);
        out.info(`${tokens.length} tokens in ${seconds.toFixed(2)} s`);
      }
    } finally {
      await model.close();
    }
  } finally {
    await access.close();
  }
}
