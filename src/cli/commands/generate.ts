import { existsSync } from 'node:fs';
import {
  deviceStepModel, generate, type GenerateOptions, generateSpeculative, generateWith, loadConfig, loadModel, loadTokenizer, localStepModel,
  promptIds as encodePrompt, type SpeculativeResult,
} from '../../models/index.ts';
import { computeDevice } from '../../tensor/index.ts';
import { loadProgress } from '../load-progress.ts';
import {
  type Flags, intFlag, numberFlag, optionalIntFlag, placement, planFlags, requiredString, stringFlag, UsageError, verifyFlags,
  weightFlags,
} from '../args.ts';
import type { FailoverEvent, VerificationSummary } from '../../user/index.ts';
import { payForJob } from '../chain-flags.ts';
import { failoverLine, type Output } from '../output.ts';
import { passesOf, speculativeFlags } from '../speculative-flags.ts';

/** `tensorlink generate`: continues a prompt, streaming the text as tokens come. */
export async function generateCommand(flags: Flags, out: Output): Promise<void> {
  const where = placement(flags);
  const { strategy, privacy } = planFlags(flags, 'layer-aware');
  const verify = verifyFlags(flags);
  const dir = requiredString(flags, 'model');
  const prompt = requiredString(flags, 'prompt');
  // a --model that is no path here names a model the swarm hosts
  if (!existsSync(dir)) return (await import('./generate-hosted.ts')).generateHosted(dir, prompt, where, flags, out);
  const format = weightFlags(flags);
  const adapter = stringFlag(flags, 'adapter');
  if (adapter !== undefined && !existsSync(adapter)) throw new UsageError(`--adapter ${adapter}: no such PEFT adapter folder`);
  // across workers the user reads only its ends from the checkpoint; sections stream from the files
  const model = where.kind === 'local' ? await loadModel(dir, { ...format, adapter }) : null;
  const config = model?.config ?? loadConfig(dir);
  const tok = model ? model.tokenizer : loadTokenizer(dir);
  if (!tok) throw new UsageError(`${dir} has no tokenizer.json; generate needs one to read the prompt`);
  const promptIds = encodePrompt(tok, prompt);
  if (promptIds.length === 0) throw new UsageError('the prompt encodes to no tokens');
  const topP = numberFlag(flags, 'top-p', 1);
  if (topP <= 0 || topP > 1) throw new UsageError('--top-p must be in (0, 1]');
  const requested = intFlag(flags, 'max-new-tokens', 32, 0);
  const room = config.maxPositions - promptIds.length;
  if (room < 0) throw new UsageError(`the prompt has ${promptIds.length} tokens, more than the model's ${config.maxPositions} positions`);
  const maxNewTokens = Math.min(requested, room);
  if (maxNewTokens < requested) out.info(`generating ${maxNewTokens} tokens: the model has ${config.maxPositions} positions`);
  const drafting = await speculativeFlags(flags, config.vocabSize);
  const produced: number[] = [];
  let printed = '';
  const started = performance.now();
  const options: GenerateOptions = {
    maxNewTokens,
    temperature: numberFlag(flags, 'temperature', 0),
    topK: optionalIntFlag(flags, 'top-k'),
    topP,
    seed: intFlag(flags, 'seed', 0, 0),
    onToken: (t) => {
      produced.push(t);
      if (!out.json) {
        const text = tok.decode(produced);
        // Print only what is stable: a multi-byte character may still be incomplete.
        if (!text.endsWith('\uFFFD')) {
          process.stdout.write(text.slice(printed.length));
          printed = text;
        }
      }
    },
  };
  let tokens: number[];
  let spec: SpeculativeResult | null = null;
  const speculate = drafting ? { ...options, ...drafting } : null;
  let verification: VerificationSummary | null = null;
  let failovers: readonly FailoverEvent[] | null = null;
  if (where.kind === 'local') {
    // --backend webgpu: each step one graph on the GPU, the KV cache there
    const device = computeDevice();
    if (speculate && device !== 'cpu') throw new UsageError('--speculative runs on the CPU backends (js, ort) in this process, not on a device yet');
    if (speculate) spec = await generateSpeculative(localStepModel(model!), promptIds, speculate);
    if (spec) tokens = spec.tokens;
    else if (device === 'cpu') tokens = (await generate(model!, promptIds, options)).tokens;
    else tokens = (await generateWith(deviceStepModel(model!, device), [promptIds], options))[0];
  } else {
    // the network's code (libp2p, the chain client) loads only for a swarm: a local generation starts lighter
    const [{ distribute }, { joinSwarm }] = await Promise.all([import('../../user/index.ts'), import('../swarm.ts')]);
    const access = await joinSwarm(where, flags);
    try {
      const onProgress = loadProgress(out);
      // through an adapter: every worker holds its section's factors beside the base
      const jobOptions = { strategy, privacy, onProgress, verify, ...format, ...(adapter ? { adapter } : {}) };
      const dm = await distribute(access.node, access.bootstrap, dir, jobOptions);
      out.info(`plan (${strategy}): ${dm.assignment.map((a) => `layers ${a.start}-${a.end - 1} on …${a.peerId.slice(-6)}`).join(', ')}`);
      try {
        await payForJob(flags, { jobId: dm.jobId, user: access.node.peerId.toString() }, out);
        if (speculate) spec = await dm.generateSpeculative(promptIds, speculate);
        tokens = spec ? spec.tokens : (await dm.generate(promptIds, options)).tokens;
        verification = dm.verification;
        for (const peer of verification?.flagged ?? []) out.info(`worker …${peer.slice(-6)} was caught cheating: flagged at the validator, and the text generated again without it`);
        failovers = dm.failovers;
        for (const e of dm.replans) out.info(`planned again (${e.reason})`);
        for (const e of failovers) out.info(failoverLine(e));
      } finally {
        await dm.close();
      }
    } finally {
      await access.close();
    }
  }
  const text = tok.decode(tokens);
  const seconds = (performance.now() - started) / 1000;
  const { passes, drafts } = passesOf(tokens.length, spec);
  if (out.json) {
    out.result({
      text, tokens, promptTokens: promptIds.length, passes, ...(drafts ? { speculative: drafts } : {}), seconds,
      ...(verification ? { verification } : {}), ...(failovers ? { failovers } : {}),
    }, '');
  } else {
    process.stdout.write(`${text.slice(printed.length)}\n`);
    const how = drafts ? `; ${drafts.accepted} of ${drafts.drafted} drafted tokens accepted` : '';
    out.info(`${tokens.length} tokens in ${seconds.toFixed(2)} s, ${passes} passes through the model${how}`);
  }
}
