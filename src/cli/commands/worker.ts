import { parseFault, parseHostSpec, startWorker } from '../../worker/index.ts';
import { createLogger } from '../../p2p/index.ts';
import { type Flags, optionalIntFlag, parseBytes, requiredString, stringFlag, UsageError, weightFlags } from '../args.ts';
import { chainFromFlags } from '../chain-flags.ts';
import type { Output } from '../output.ts';
import { announceFlags, logLevel, ready, runUntilSignal, validatorsFlag } from './node-process.ts';

/** `tensorlink worker`: lends this machine's compute to the swarm of its validator. */
export async function workerCommand(flags: Flags, out: Output): Promise<void> {
  const bootstrap = requiredString(flags, 'bootstrap');
  validatorsFlag(bootstrap);
  const memory = stringFlag(flags, 'memory');
  const gpuMemory = stringFlag(flags, 'gpu-memory');
  const listen = stringFlag(flags, 'listen');
  const faultText = stringFlag(flags, 'fault');
  let fault;
  try {
    fault = faultText === undefined ? undefined : parseFault(faultText);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  let host;
  try {
    host = ((flags.host as string[] | undefined) ?? []).map(parseHostSpec);
  } catch (err) {
    throw new UsageError((err as Error).message);
  }
  const format = weightFlags(flags);
  const hostFormat = format.quantize ?? (format.dtype === 'bf16' ? 'bf16' : null);
  if (flags['host-auto'] === true && !stringFlag(flags, 'models')) throw new UsageError('--host-auto chooses among the checkpoints under --models DIR: give one');
  const rebalance = optionalIntFlag(flags, 'rebalance', 0);
  if (rebalance !== undefined && flags['host-auto'] !== true) throw new UsageError('--rebalance is for --host-auto: a host that chose its blocks itself');
  const dataDir = stringFlag(flags, 'data');
  const chain = await chainFromFlags(flags, dataDir);
  const w = await startWorker({
    bootstrap,
    // a browser tab that joins the swarm reaches this worker over WebRTC-direct
    browsers: true,
    fault,
    chain,
    dataDir,
    modelsDir: stringFlag(flags, 'models'),
    host,
    hostFormat,
    ...(flags['host-auto'] === true ? { hostAuto: rebalance === undefined ? {} : { rebalanceMs: 1000 * rebalance } } : {}),
    listen: listen ? [listen] : undefined,
    announce: announceFlags(flags),
    memoryBytes: memory ? parseBytes(memory) : undefined,
    ...(stringFlag(flags, 'store-max') ? { storeMaxBytes: parseBytes(stringFlag(flags, 'store-max')!) } : {}),
    ...(gpuMemory ? { deviceMemoryBytes: parseBytes(gpuMemory) } : {}),
    requestsPerSecond: optionalIntFlag(flags, 'max-requests', 1),
    log: createLogger({ level: logLevel(flags), peer: 'worker' }),
  });
  const addrs = w.node.getMultiaddrs().map(String);
  ready(w.node.peerId.toString(), addrs, w.account);
  out.info(`worker ${w.node.peerId.toString()} (${w.capabilities.backend}, ${w.capabilities.gflops} GFLOP/s, tier ${w.capabilities.tier}) joined ${bootstrap}`);
  for (const h of host) out.info(`hosting ${h.name} (${h.blocks ? `blocks ${h.blocks[0]}-${h.blocks[1]}` : 'every block'}) in ${hostFormat ?? 'f32'}`);
  if (fault) out.info(`this worker CHEATS on purpose (--fault ${fault.kind}:${fault.rate}), to test the network's defences`);
  await runUntilSignal(w.stop, flags);
}
