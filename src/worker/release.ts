/**
 * What a job's section leaves behind in the compute backend: onnxruntime holds a session per compact weight (and per
 * fused group), each with its own prepacked copy of the weight, for as long as the backend lives. A job that goes lets
 * go of them with its weights. A section over a hosted span shares the span's weights: they go with the span.
 */
import { getBackend, type PackedMatrix } from '../tensor/index.ts';
import type { JobEntry } from './jobs.ts';

export function releaseBackendCopies(job: JobEntry): void {
  const section = job.section;
  const backend = getBackend();
  if (!section || section.shared || !backend.releasePacked) return;
  const packed: PackedMatrix[] = [];
  for (const t of section.model.hfStateDict().values()) if (t.packed) packed.push(t.packed);
  if (packed.length > 0) backend.releasePacked(packed);
}
