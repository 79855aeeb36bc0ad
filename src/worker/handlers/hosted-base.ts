import { InvalidMessageError } from '../../errors.ts';
import { adaptModel, type CausalLM, createModel, type ModelConfig } from '../../models/index.ts';
import { type HostedSpan, jobConfigHash, type LoadRequest } from '../../p2p/index.ts';
import { holdPacked } from '../../tensor/index.ts';
import type { JobTable } from '../jobs.ts';

/**
 * A job's section over blocks this worker hosts (`load` with `base`): built empty, every base weight shares the hosted
 * span's (its packed bytes, or its float32 buffer: one copy for every job over it), and the job's adapter on top, the
 * base frozen. The section computes as one built from the same files; only the adapter's factors are the job's.
 */
export function sectionOverHosted(jobs: JobTable, request: LoadRequest, config: ModelConfig): { model: CausalLM; span: HostedSpan } {
  const [start, end] = request.section;
  if (!request.adapter) throw new InvalidMessageError('a section over a hosted model trains an adapter: the hosted base is frozen and shared');
  const host = jobs.hostedSpans().find((j) => j.hosted!.hash === request.base && j.section !== undefined
    && j.section.range[0] <= start && end <= j.section.range[1]);
  if (!host) throw new InvalidMessageError(`this worker hosts no span of model ${request.base!.slice(0, 12)}… covering layers [${start}, ${end})`);
  const span = host.hosted!;
  const hosted = host.section!;
  if (jobConfigHash(request.config) !== hosted.configHash) throw new InvalidMessageError(`the config of the load is not hosted model ${span.name}'s`);
  if ((request.format ?? 'f32') !== span.format) {
    throw new InvalidMessageError(`${span.name} is hosted in ${span.format}; the load asks for ${request.format ?? 'f32'}`);
  }
  const model = createModel(config, { section: request.section, init: false });
  const shared = hosted.model.hfStateDict();
  for (const [name, t] of model.hfStateDict()) {
    const src = shared.get(name);
    if (!src || src.shape.join() !== t.shape.join()) throw new InvalidMessageError(`'${name}' of the section is not a weight of hosted model ${span.name}`);
    if (src.packed) holdPacked(t, src.packed);
    else t.data = src.data;
  }
  adaptModel(model, request.adapter, { part: true });
  return { model, span };
}
