import { existsSync } from 'node:fs';
import { basename, resolve } from 'node:path';
import { AdapterSet, defaultCacheDir, generateBatch, loadChatTemplate, loadConfig, loadModel, loadTokenizer } from '../../models/index.ts';
import {
  ChatFormat, countSpeculative, type Row, serveApi, type ServedModel, speculativeCounts, speculativeRunner, streamedOnce,
} from '../../serve/index.ts';
import { cachedEnds, distribute, fetchOverview, HostedModel, type Overview } from '../../user/index.ts';
import {
  type Flags, intFlag, placement, planFlags, requiredString, stringFlag, UsageError, verifyFlags, weightFlags,
} from '../args.ts';
import { payForJob } from '../chain-flags.ts';
import { loadProgress } from '../load-progress.ts';
import type { Output } from '../output.ts';
import { speculativeFlags } from '../speculative-flags.ts';
import { joinSwarm, type SwarmAccess } from '../swarm.ts';
import { openHosted } from './generate-hosted.ts';
import { runUntilSignal, validatorsFlag } from './node-process.ts';

/** `--adapter NAME=DIR` (repeatable): each PEFT adapter folder under the name a request's `model` ('ID:NAME') picks it by. */
function adapterFlags(flags: Flags): [string, string][] {
  return ((flags.adapter as string[] | undefined) ?? []).map((spec) => {
    const m = /^([A-Za-z0-9._-]{1,64})=(.+)$/.exec(spec);
    if (!m) throw new UsageError(`--adapter ${spec}: say NAME=DIR (NAME of letters, digits, '.', '_' or '-')`);
    if (!existsSync(m[2])) throw new UsageError(`--adapter ${spec}: no such PEFT adapter folder '${m[2]}'`);
    return [m[1], m[2]];
  });
}

/**
 * `tensorlink serve`: the OpenAI-compatible HTTP API over a model, in this process (`--local 0`,
 * the default) or split across a swarm (`--local N`, `--bootstrap`). Prints one JSON line when
 * it listens: {"event":"ready","url":"http://HOST:PORT","model":"ID"}; runs until Ctrl-C.
 */
export async function serveCommand(flags: Flags, out: Output): Promise<void> {
  const where = placement(flags);
  const { strategy, privacy } = planFlags(flags, 'layer-aware');
  const verify = verifyFlags(flags);
  const dir = requiredString(flags, 'model');
  const format = weightFlags(flags);
  const port = intFlag(flags, 'port', 8000, 0);
  if (port > 65535) throw new UsageError(`--port must be in 0..65535, got ${port}`);
  const host = stringFlag(flags, 'host') ?? '127.0.0.1';
  const adapterSpecs = adapterFlags(flags);
  if (adapterSpecs.length > 0 && where.kind !== 'local') throw new UsageError('--adapter NAME=DIR: adapters are served in this process for now (--local 0)');
  // a --model that is no path here names a model the swarm hosts: this process holds its ends for all its clients
  const hosted = !existsSync(dir);
  if (hosted && where.kind !== 'remote') throw new UsageError(`'${dir}' is no file here: a hosted model is served with --bootstrap ADDR`);
  let files = hosted ? stringFlag(flags, 'ends') : dir;
  // a hosted model without --ends: its ends are pulled from a host once, into the cache (as pull-ends does)
  let early: SwarmAccess | null = null;
  if (hosted && !files && where.kind === 'remote') {
    early = await joinSwarm(where, flags);
    try {
      const cached = await cachedEnds(early.node, validatorsFlag(early.bootstrap), dir, defaultCacheDir(), {
        onProgress: (done, total) => out.progress(`pulling the ends of '${dir}': ${(done / 2 ** 20).toFixed(1)} of ${(total / 2 ** 20).toFixed(1)} MiB`),
      });
      if (cached.pulled) out.info(`pulled the ends of '${dir}' (${cached.hash.slice(0, 12)}…) from …${cached.pulled.host.slice(-8)} into ${cached.dir}`);
      files = cached.dir;
    } catch (err) {
      await early.close();
      throw err;
    }
  }
  if (!files) throw new UsageError(`serving the hosted model '${dir}' needs its ends: --ends DIR (a checkpoint or GGUF file of it)`);
  const id = stringFlag(flags, 'name') ?? (hosted ? dir : basename(resolve(dir)));
  const config = loadConfig(files);
  const tokenizer = loadTokenizer(files);
  if (!tokenizer) {
    await early?.close();
    throw new UsageError(`${files} has no tokenizer.json; serve needs one to read prompts`);
  }
  const chat = new ChatFormat(loadChatTemplate(files));
  // speculative decoding: across workers or hosts, where a trip costs what the network does (in this process each
  // request's rows join the running batch instead)
  const drafts = await speculativeFlags(flags, config.vocabSize);
  if (drafts && where.kind === 'local') {
    await early?.close();
    throw new UsageError('--speculative and --draft speed up a model across workers or hosts (--local N, --bootstrap); in this process requests batch continuously');
  }
  let served: ServedModel;
  let leave = async () => {};
  let overview: (() => Promise<Overview>) | undefined;
  if (hosted && where.kind === 'remote') {
    const access = early ?? await joinSwarm(where, flags);
    try {
      const ends = await loadModel(files, { part: 'ends', ...format });
      const model = await openHosted(HostedModel, access, dir, ends, flags, out);
      const validator = validatorsFlag(access.bootstrap);
      overview = () => fetchOverview(access.node, validator);
      // each request's row is a session of its own over the hosts, which batch the steps of the sessions waiting at once
      // (continuous batching on the hosts: a request starts at once); with drafts, a row is decoded speculatively
      const counts = drafts ? speculativeCounts() : null;
      const rows = async (row: Row) => {
        // a generation run again (a host caught) streams nothing twice, and ends the row where it differs from what was sent
        const onToken = streamedOnce(row);
        if (!drafts || !counts || row.options.mask) await model.generateBatch([row.prompt], { rows: [row.options], onToken });
        else countSpeculative(counts, await model.generateSpeculative(row.prompt, { ...row.options, ...drafts, onToken }));
      };
      const run: ServedModel['run'] = async (prompts, options) => ({ tokens: await model.generateBatch(prompts, options) });
      served = { id, tokenizer, maxPositions: config.maxPositions, chat, run, rows, ...(counts ? { speculative: counts } : {}) };
      leave = async () => {
        await model.close().catch(() => {});
        await access.close();
      };
    } catch (err) {
      await access.close();
      throw err;
    }
  } else if (where.kind === 'local') {
    const model = await loadModel(dir, format);
    // the base held once; each adapter's factors beside it, put on for the batches that ask for it
    const adapters = new AdapterSet(model);
    for (const [name, path] of adapterSpecs) {
      const c = adapters.add(name, path);
      out.info(`adapter '${name}' (LoRA r ${c.r}, alpha ${c.alpha}) from ${path}: requests for model '${id}:${name}' run through it`);
    }
    const run: ServedModel['run'] = (prompts, options, adapter) => {
      adapters.use(adapter);
      return generateBatch(model, prompts, options);
    };
    // without adapters its requests batch continuously (rows join the running batch at the next step)
    const local = adapterSpecs.length === 0 ? { local: model } : {};
    served = { id, tokenizer, maxPositions: config.maxPositions, chat, run, adapters: adapters.names, ...local };
  } else {
    const access = await joinSwarm(where, flags);
    try {
      const dm = await distribute(access.node, access.bootstrap, dir, {
        strategy, privacy, onProgress: loadProgress(out), verify, name: id, ...format,
      });
      await payForJob(flags, { jobId: dm.jobId, user: access.node.peerId.toString() }, out);
      const validator = validatorsFlag(access.bootstrap);
      overview = () => fetchOverview(access.node, validator);
      out.info(`plan (${strategy}): ${dm.assignment.map((a) => `layers ${a.start}-${a.end - 1} on …${a.peerId.slice(-6)}`).join(', ')}`);
      const batched: ServedModel['run'] = (prompts, options) => dm.generateBatch(prompts, options);
      const fast = drafts ? speculativeRunner(batched, (p, o) => dm.generateSpeculative(p, o), drafts) : null;
      const speculative = fast ? { speculative: fast.counts } : {};
      served = { id, tokenizer, maxPositions: config.maxPositions, chat, run: fast?.run ?? batched, ...speculative };
      leave = async () => {
        await dm.close().catch(() => {});
        await access.close();
      };
    } catch (err) {
      await access.close();
      throw err;
    }
  }
  let server;
  try {
    server = await serveApi(served, { host, port, ...(overview ? { overview } : {}) });
  } catch (err) {
    await leave();
    throw new UsageError(`cannot listen on ${host}:${port}: ${(err as Error).message}`);
  }
  process.stdout.write(`${JSON.stringify({ event: 'ready', url: server.url, model: id, dashboard: `${server.url}/` })}\n`);
  out.info(`serving '${id}' at ${server.url}/v1 (OpenAI-compatible: /v1/models, /v1/completions, /v1/chat/completions)`);
  out.info(`dashboard: ${server.url}/ (metrics for Prometheus at ${server.url}/metrics)`);
  await runUntilSignal(async () => {
    await server.close();
    await leave();
  }, flags);
}
