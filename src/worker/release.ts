/**
 * What a job's section leaves behind in the compute backend: onnxruntime holds a session per compact weight (and per
 * fused group), each with its own prepacked copy of the weight, for as long as the backend lives. The job's budget
 * counts those copies (`runtime`), and a job that goes lets go of them with its weights. A section over a hosted span
 * shares the span's weights: their copies are the span's, counted under it, and go with it.
 */
import { hostedJobId } from '../p2p/index.ts';
import { type CausalLM, compactWeight, weightBytes } from '../models/index.ts';
import { getBackend, type PackedMatrix, type WeightFormat } from '../tensor/index.ts';
import type { JobEntry, Section } from './jobs.ts';
import type { MemoryBudget } from './memory.ts';

/** A section's int8/int4 weights (listed once per section: its weights do not change once built). */
const listed = new WeakMap<Section, PackedMatrix[]>();

function packedWeights(section: Section): PackedMatrix[] {
  let packed = listed.get(section);
  if (packed === undefined) {
    packed = [];
    for (const t of section.model.hfStateDict().values()) if (t.packed && t.packed.format !== 'bf16') packed.push(t.packed);
    listed.set(section, packed);
  }
  return packed;
}

/**
 * The least a compact model's weights make the backend keep once they compute: one prepacked copy of each int8/int4
 * matrix (bf16 ones are widened a chunk at a time and leave none). Read from the weights' names and shapes, so it holds
 * for a section built empty, before its weights arrive: a load is admitted with it reserved. 0 where the backend keeps no
 * copies.
 */
export function copyReserve(model: CausalLM, format: WeightFormat | 'f32' | null): number {
  if (format === null || format === 'f32' || format === 'bf16' || !getBackend().prepackedBytes) return 0;
  let bytes = 0;
  for (const [name, t] of model.hfStateDict()) if (compactWeight(name, t.shape)) bytes += weightBytes(name, t.shape, format);
  return bytes;
}

/**
 * Counts in the budget what the backend keeps now beside the section's compact weights: after a request ran, the copies
 * its sessions hold (one per pool size and per fused group a weight was used in). Memory that exists is counted, not
 * refused; what is held past the reserve makes the next load's admission stricter.
 */
export function countBackendCopies(job: JobEntry, memory: MemoryBudget): void {
  const section = job.section;
  const backend = getBackend();
  if (!section || !backend.prepackedBytes) return;
  const packed = packedWeights(section);
  if (packed.length === 0) return;
  const holder = section.shared ? hostedJobId(section.shared) : job.jobId;
  let bytes = Math.max(backend.prepackedBytes(packed), copyReserve(section.model, section.held.format));
  if (section.shared) {
    // the span's copies: a job over part of it sees only its part's, which never lowers what the span holds; a span
    // that left holds nothing to count against
    if (memory.held(holder, 'weights') === 0) return;
    bytes = Math.max(bytes, memory.held(holder, 'runtime'));
  }
  memory.count(holder, 'runtime', bytes - memory.held(holder, 'runtime'));
}

export function releaseBackendCopies(job: JobEntry): void {
  const section = job.section;
  const backend = getBackend();
  if (!section || section.shared || !backend.releasePacked) return;
  const packed = packedWeights(section);
  if (packed.length > 0) backend.releasePacked(packed);
}
