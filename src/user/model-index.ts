import type { Libp2p } from '@libp2p/interface';
import { InvalidArgumentError, PlanInfeasibleError } from '../errors.ts';
import { type DialTarget, type HostedModelEntry, mergeModelEntries, parseModelsAnswer, request } from '../p2p/index.ts';

/** One page of the validator's index of hosted models (`tensorlink models`). */
export async function listModels(node: Libp2p, validator: DialTarget, page = 0): Promise<{ models: HostedModelEntry[]; next?: number }> {
  return parseModelsAnswer(await request(node, validator, { type: 'models', page }));
}

/** Every page of the model index, a model listed in several entries (one per MODEL_HOSTS_PER_ENTRY hosts) merged. */
export async function allModels(node: Libp2p, validator: DialTarget): Promise<HostedModelEntry[]> {
  const entries: HostedModelEntry[] = [];
  for (let page: number | undefined = 0; page !== undefined;) {
    const answer: { models: HostedModelEntry[]; next?: number } = await listModels(node, validator, page);
    entries.push(...answer.models);
    page = answer.next;
  }
  return mergeModelEntries(entries);
}

/** The model named `name` in the validator's index (`hash`: that copy, when several are hosted under the name). */
export async function findModel(node: Libp2p, validator: DialTarget, name: string, hash?: string): Promise<HostedModelEntry> {
  const found = (await allModels(node, validator)).filter((m) => m.name === name && (hash === undefined || m.hash === hash));
  if (found.length === 0) throw new PlanInfeasibleError(`no host announces a model named '${name}'${hash ? ` with hash ${hash.slice(0, 12)}…` : ''}`);
  if (found.length > 1) {
    throw new InvalidArgumentError(`'${name}' is hosted in ${found.length} different copies (hashes ${found.map((m) => m.hash.slice(0, 12)).join(', ')}): name one by its hash`);
  }
  return found[0];
}
