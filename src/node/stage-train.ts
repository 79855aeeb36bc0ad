import { InvalidArgumentError, InvalidMessageError } from '../errors.ts';
import type { WireTensor } from '../p2p/frames.ts';
import { GradientExchange, StageExecutor } from '../pipeline/index.ts';
import type { CausalLM } from '../models/index.ts';
import type { Tensor } from '../tensor/index.ts';
import type { JobEntry } from './jobs.ts';
import { fromWire } from './wire-tensor.ts';

/** Bytes per parameter a trained section needs: weights, gradients and AdamW's two moments. */
export const TRAINING_BYTES_PER_PARAM = 16;

/** A section being trained on a worker. */
export interface Training {
  executor: StageExecutor;
  exchange: GradientExchange;
}

/** What a worker has done for its jobs (for the swarm's summary). */
export interface WorkCounters {
  /** Forwards of inference sessions (prefill and decoding steps). */
  forwards: number;
  trainForwards: number;
  trainBackwards: number;
  optimizerSteps: number;
  /** Tokens through its training forwards. */
  trainTokens: number;
}

export function newWorkCounters(): WorkCounters {
  return { forwards: 0, trainForwards: 0, trainBackwards: 0, optimizerSteps: 0, trainTokens: 0 };
}

/** Sends a job's gradients to another holder of the same parameters (a replica, a tied head). */
export type SendGrads = (addr: string, header: Record<string, unknown>, grads: Tensor[]) => Promise<void>;

export type Reply = { kind: 'tensor'; tensor: Tensor } | { kind: 'control'; message: Record<string, unknown> } | { kind: 'none' };

export const TRAINING_REQUESTS = new Set(['train-setup', 'train-forward', 'train-backward', 'grad-squares', 'reduce', 'grads', 'step', 'weight', 'train-reset', 'moment-steps', 'moments', 'set-moments']);

function micro(h: Record<string, unknown>): number {
  if (!Number.isInteger(h.micro) || (h.micro as number) < 0 || (h.micro as number) > 1_000_000) throw new InvalidMessageError('micro must be a micro-batch index');
  return h.micro as number;
}

function names(v: unknown): string[] {
  if (!Array.isArray(v) || v.length > 100_000 || !v.every((n) => typeof n === 'string' && n.length <= 256)) {
    throw new InvalidMessageError('names must be a list of parameter names');
  }
  return v as string[];
}

function finite(v: unknown, what: string, min = 0): number {
  if (typeof v !== 'number' || !Number.isFinite(v) || v < min) throw new InvalidMessageError(`${what} must be a finite number ≥ ${min}`);
  return v;
}

/**
 * The training side of the stage protocol (see stage.ts), for a job whose section is loaded:
 *   train-setup    {lr, weightDecay, recompute, peers}  → {names}: AdamW on the worker; `peers`
 *                  (peer ids) may send gradients of this job (its replicas, a tied head).
 *   train-forward  {micro} + input       → output        train-backward {micro} + gradient → input gradient
 *   grad-squares   {names} → {values}    reduce {key, names, peers, index} → {} (worker to worker: grads)
 *   step           {scale, lr} → {}      weight {name} → tensor      train-reset → {}
 *   moment-steps {names} → {steps: (n|null)[]}   moments {name} → [2, ...shape]   set-moments {name, step} + moments → {}
 */
export async function handleTraining(
  h: Record<string, unknown>,
  tensors: WireTensor[],
  job: JobEntry,
  section: { model: CausalLM; training?: Training },
  context: { memoryBytes: number; work: WorkCounters; sendGrads: SendGrads },
): Promise<Reply> {
  if (h.type === 'train-setup') {
    const params = section.model.numParameters();
    const need = params * TRAINING_BYTES_PER_PARAM;
    if (need > context.memoryBytes) {
      throw new InvalidArgumentError(`training this section needs ${need} bytes (weights, gradients, AdamW state), this worker offers ${context.memoryBytes}`);
    }
    const peers = Array.isArray(h.peers) ? h.peers : [];
    if (peers.length > 256 || !peers.every((p) => typeof p === 'string' && p.length <= 128)) throw new InvalidMessageError('peers must be peer ids');
    for (const p of peers as string[]) job.delegates.add(p);
    const executor = new StageExecutor(section.model.layers, section.model.config.maxPositions, {
      lr: finite(h.lr, 'lr'),
      weightDecay: h.weightDecay === undefined ? undefined : finite(h.weightDecay, 'weightDecay'),
      recompute: h.recompute === true,
    });
    section.training = { executor, exchange: new GradientExchange() };
    return { kind: 'control', message: { type: 'train-ready', names: [...executor.named.keys()] } };
  }
  const training = section.training;
  if (!training) throw new InvalidMessageError(`job ${job.jobId} is not set up for training on this worker`);
  const { executor, exchange } = training;
  const one = () => {
    if (tensors.length !== 1) throw new InvalidMessageError(`${String(h.type)} takes one tensor`);
    return fromWire(tensors[0]);
  };
  switch (h.type) {
    case 'train-forward': {
      const input = one();
      context.work.trainForwards++;
      context.work.trainTokens += input.shape[0] * input.shape[1];
      return { kind: 'tensor', tensor: executor.forward(micro(h), input) };
    }
    case 'train-backward': {
      context.work.trainBackwards++;
      const g = executor.backward(micro(h), one());
      return g ? { kind: 'tensor', tensor: g } : { kind: 'control', message: { type: 'no-input-gradient' } };
    }
    case 'grad-squares':
      return { kind: 'control', message: { type: 'grad-squares', values: executor.gradSquares(names(h.names)) } };
    case 'grads': {
      if (typeof h.key !== 'string' || h.key.length > 128) throw new InvalidMessageError('key must be a short string');
      exchange.deliver(h.key, h.index as number, tensors.map(fromWire));
      return { kind: 'none' };
    }
    case 'reduce': {
      const list = names(h.names);
      const addrs = h.peers;
      if (!Array.isArray(addrs) || addrs.length > 256 || !addrs.every((a) => typeof a === 'string' && a.length <= 512)) {
        throw new InvalidMessageError('peers must be addresses');
      }
      if (typeof h.key !== 'string' || h.key.length > 128 || !Number.isInteger(h.index)) throw new InvalidMessageError('reduce needs {key, index}');
      const group = { key: h.key, names: list, peers: addrs as string[], index: h.index as number };
      await exchange.reduce(executor, group, (addr, grads) =>
        context.sendGrads(addr, { type: 'grads', jobId: job.jobId, key: group.key, index: group.index }, grads));
      return { kind: 'control', message: { type: 'reduced' } };
    }
    case 'step':
      executor.step(finite(h.scale, 'scale'), finite(h.lr, 'lr'));
      context.work.optimizerSteps++;
      return { kind: 'control', message: { type: 'stepped' } };
    case 'weight': {
      const p = executor.named.get(String(h.name));
      if (!p) throw new InvalidMessageError(`'${String(h.name)}' is not a parameter of this section`);
      return { kind: 'tensor', tensor: p };
    }
    case 'moment-steps':
      return { kind: 'control', message: { type: 'moment-steps', steps: names(h.names).map((n) => executor.stepsOf(n)) } };
    case 'moments': {
      const m = executor.moments(String(h.name));
      if (!m) throw new InvalidMessageError(`'${String(h.name)}' has no optimizer state yet`);
      return { kind: 'tensor', tensor: m.moments };
    }
    case 'set-moments':
      executor.setMoments(String(h.name), one(), finite(h.step, 'step'));
      return { kind: 'control', message: { type: 'moments-set' } };
    case 'train-reset':
      executor.reset();
      return { kind: 'control', message: { type: 'reset' } };
    default:
      throw new InvalidMessageError(`unknown stage request '${String(h.type)}'`);
  }
}
