// The worker's job table (src/worker/jobs.ts): a job belongs to the peer that opened it, and no one peer fills the table.
import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import type { PeerId } from '@libp2p/interface';
import type { HostedSpan } from '../../src/p2p/index.ts';
import { JobTable, type Loading, MAX_JOBS_PER_PEER, MAX_JOBS_PER_WORKER, type Section } from '../../src/worker/jobs.ts';

const peer = (name: string) => ({ toString: () => name }) as unknown as PeerId;

describe('the job table', () => {
  test('a peer holds at most its share of a worker\'s jobs; the others still open theirs; closing one makes room', () => {
    const jobs = new JobTable();
    for (let i = 0; i < MAX_JOBS_PER_PEER; i++) jobs.open(`a-${i}`, peer('a'));
    assert.equal(jobs.open('a-0', peer('a')).jobId, 'a-0', 'its own job opened again is the same job');
    assert.throws(() => jobs.open('a-extra', peer('a')), { name: 'RateLimitedError', message: /16 jobs on this worker/ });
    assert.throws(() => jobs.open('a-0', peer('b')), { name: 'UnauthorizedError' });
    // the rest of the table is the others'
    for (let p = 0; jobs.size < MAX_JOBS_PER_WORKER; p++) jobs.open(`b-${p}`, peer(`b${Math.floor(p / MAX_JOBS_PER_PEER)}`));
    assert.throws(() => jobs.open('c-0', peer('c')), { name: 'InvalidArgumentError', message: /64 jobs/ });
    jobs.close('a-0', peer('a'));
    assert.equal(jobs.open('a-extra', peer('a')).owner, 'a');
  });

  test('a hosted span that leaves takes the jobs over it along (they share its buffers, which its budget no longer counts)', () => {
    const released: string[] = [];
    const jobs = new JobTable((gone) => released.push(gone.jobId));
    const span: HostedSpan = { name: 'tiny', hash: 'a'.repeat(64), blocks: 2, layers: [0, 1], format: 'f32', state: 'online' };
    const host = jobs.host('host_tiny', 'self', span);
    const over = jobs.open('adapter-job', peer('u'));
    over.section = { shared: span } as Section;
    const loading = jobs.open('adapter-loading', peer('v'));
    loading.loading = { shared: span } as Loading;
    const other = jobs.open('private', peer('w'));
    jobs.remove(host.jobId);
    assert.deepEqual(released.sort(), ['adapter-job', 'adapter-loading', 'host_tiny']);
    assert.deepEqual([...jobs.values()].map((j) => j.jobId), [other.jobId]);
  });
});
