import { int, obj } from '../../schema.ts';

/**
 * Messages of the probe protocol:
 *   ping   {probe: i}           → {ok: true}
 *   tensor frame of N bytes     → {ok: true, bytes: N}
 */
export function parseProbeAnswer(message: unknown): { bytes: number | null } {
  const m = obj(message, 'probe answer');
  return { bytes: m.bytes === undefined ? null : int(m.bytes, 'probe answer.bytes') };
}
