import { validatorsFlag } from './node-process.ts';
import { type CausalLM, defaultCacheDir, type GenerateOptions, loadModel, promptIds as encodePrompt } from '../../models/index.ts';
import { hostedModelJob } from '../../p2p/index.ts';
import type { cachedEnds as CachedEnds, HostedModel as HostedModelClass } from '../../user/index.ts';
import { type Flags, intFlag, numberFlag, optionalIntFlag, type Placement, stringFlag, UsageError, verifyFlags, weightFlags } from '../args.ts';
import { payForJob } from '../chain-flags.ts';
import { passesOf, speculativeFlags } from '../speculative-flags.ts';
import type { Output } from '../output.ts';
import type { Libp2p } from '@libp2p/interface';

/**
 * The ends of the hosted model `name` in the format the user asks (--dtype, --quantize), as its hosts hold the blocks
 * in theirs: from --ends DIR (a checkpoint directory or GGUF file of the same model: only its embedding, final norm
 * and head are loaded), or without it pulled from a host once into the cache (defaultCacheDir()/ends/HASH), checked
 * against the model's hash as `pull-ends` does, and read from there after.
 */
export async function loadEnds(
  access: { node: Libp2p; bootstrap: string }, name: string, flags: Flags, out: Output, cachedEnds: typeof CachedEnds,
): Promise<CausalLM> {
  let dir = stringFlag(flags, 'ends');
  if (!dir) {
    const cached = await cachedEnds(access.node, validatorsFlag(access.bootstrap), name, defaultCacheDir(), {
      onProgress: (done, total) => out.progress(`pulling the ends of '${name}': ${(done / 2 ** 20).toFixed(1)} of ${(total / 2 ** 20).toFixed(1)} MiB`),
    });
    if (cached.pulled) out.info(`pulled the ends of '${name}' (${cached.hash.slice(0, 12)}…) from …${cached.pulled.host.slice(-8)} into ${cached.dir}`);
    dir = cached.dir;
  }
  return loadModel(dir, { part: 'ends', ...weightFlags(flags) });
}

/**
 * Opens the hosted model `name` for a command's user: checked at `--redundancy K` routes and `--verify-rate`; with
 * `--contracts`, `--pay` tokens go into the user's escrow for the model (hostedModelJob) and every step the hosts
 * sign goes to the ledger with the user's acceptance, so the validators pay the hosts from it by their FLOPs.
 */
export async function openHosted(
  Hosted: typeof HostedModelClass, access: { node: Libp2p; bootstrap: string }, name: string, ends: CausalLM, flags: Flags, out: Output,
): Promise<HostedModelClass> {
  const { redundancy, sampleRate, chunkRate, exact } = verifyFlags(flags);
  const paid = stringFlag(flags, 'contracts') !== undefined;
  // --verify exact re-runs sampled steps at --verify-rate; by default sampled chunks are checked at --chunk-rate, and
  // the steps that close none at --verify-rate
  const verify = exact ? { redundancy, mode: 'reexec' as const, sampleRate } : { redundancy, mode: 'commit' as const, sampleRate: chunkRate, tailRate: sampleRate };
  const model = await Hosted.open(access.node, access.bootstrap, name, { ends, verify, ledger: paid });
  try {
    out.info(`${name} (${model.entry.hash.slice(0, 12)}…): ${model.entry.layers} blocks on ${new Set(model.entry.hosts.map((h) => h.peerId)).size} hosts`);
    if (paid) await payForJob(flags, { jobId: hostedModelJob(model.entry), user: access.node.peerId.toString() }, out);
  } catch (err) {
    await model.close();
    throw err;
  }
  return model;
}

/**
 * `generate --model NAME --bootstrap ADDR [--ends DIR]`: generation from a model the swarm hosts (`worker --host`), by
 * name. The user holds only its ends (see loadEnds), with the tokenizer; the blocks run on hosts that cover them.
 */
export async function generateHosted(name: string, prompt: string, where: Placement, flags: Flags, out: Output): Promise<void> {
  if (where.kind !== 'remote') throw new UsageError(`'${name}' is no file here: a hosted model is used with --bootstrap ADDR`);
  const [{ HostedModel, cachedEnds }, { joinSwarm }] = await Promise.all([import('../../user/index.ts'), import('../swarm.ts')]);
  const access = await joinSwarm(where, flags);
  let ends: CausalLM;
  let tok: NonNullable<CausalLM['tokenizer']>;
  let promptIds: number[];
  let maxNewTokens: number;
  try {
    ends = await loadEnds(access, name, flags, out, cachedEnds);
    if (!ends.tokenizer) throw new UsageError(`the ends of '${name}' come with no tokenizer; generate needs one to read the prompt`);
    tok = ends.tokenizer;
    promptIds = encodePrompt(tok, prompt);
    if (promptIds.length === 0) throw new UsageError('the prompt encodes to no tokens');
    maxNewTokens = Math.min(intFlag(flags, 'max-new-tokens', 32, 0), ends.config.maxPositions - promptIds.length);
    if (maxNewTokens < 0) throw new UsageError(`the prompt has ${promptIds.length} tokens, more than the model's ${ends.config.maxPositions} positions`);
  } catch (err) {
    await access.close();
    throw err;
  }
  const started = performance.now();
  try {
    const model = await openHosted(HostedModel, access, name, ends, flags, out);
    let printed = '';
    const produced: number[] = [];
    try {
      const options: GenerateOptions = {
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
      };
      // --speculative lookup or --draft DIR: drafts checked several per pass, the hosts keeping the accepted positions
      const drafting = await speculativeFlags(flags, ends.config.vocabSize);
      const speculative = drafting ? { ...options, ...drafting } : null;
      const spec = speculative ? await model.generateSpeculative(promptIds, speculative) : null;
      const tokens = spec ? spec.tokens : (await model.generate(promptIds, options)).tokens;
      const { passes, drafts } = passesOf(tokens.length, spec);
      const text = tok.decode(tokens);
      const seconds = (performance.now() - started) / 1000;
      for (const f of model.failovers) out.info(`blocks ${f.layers[0]}-${f.layers[1]} lost their host …${f.peerId.slice(-6)}: moved to others, ${f.replayed} steps replayed`);
      const failovers = model.failovers.length > 0 ? { failovers: model.failovers } : {};
      const ledgerError = await model.drain();
      if (ledgerError) out.info(`warning: the validator's ledger did not take every step: ${ledgerError.message}`);
      const escrow = { job: hostedModelJob(model.entry), user: access.node.peerId.toString() };
      const paid = model.recorded.records > 0 ? { recorded: { ...model.recorded, escrow } } : {};
      if (model.recorded.records > 0) out.info(`${model.recorded.records} steps of the hosts (${model.recorded.flops} FLOPs) handed to the ledger, paid from your escrow`);
      const speculativeJson = drafts ? { speculative: drafts } : {};
      const about = { promptTokens: promptIds.length, passes, ...speculativeJson, seconds, model: { name, hash: model.entry.hash } };
      // what the validators' re-runs of sampled steps found: checked, failed, left unchecked (no validator answered)
      const { checked, failed, unchecked, flagged } = model.verification;
      const checks = checked + unchecked > 0 ? { verification: { checked, failed, unchecked, flagged } } : {};
      if (out.json) out.result({ text, tokens, ...about, ...failovers, ...paid, ...checks }, '');
      else {
        process.stdout.write(`${text.slice(printed.length)}\n`);
        out.info(`${tokens.length} tokens in ${seconds.toFixed(2)} s, ${passes} passes through the hosts`);
      }
    } finally {
      await model.close();
    }
  } finally {
    await access.close();
  }
}
