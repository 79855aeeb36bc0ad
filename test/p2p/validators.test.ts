import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Validators } from '../../src/p2p/index.ts';

const A = '12D3KooWGMwbEsPQmKLqH71EZ74oPxsohhz6m2cbex3RWrwTee1y';
const B = '12D3KooWM5iV4XfoRQimHDre8BMMUzBuBAS6Bjg7FDQv8p9qyzRq';
const C = '12D3KooWEppdu2wQdw5wrcVZS3jgRf6aofGgmZeTebfQVMyuH5nM';

describe('a set of validators (--bootstrap A,B,C)', () => {
  test('parsed from a comma list; the one asked moves on when it fails, and back round', () => {
    const v = Validators.parse(`/ip4/10.0.0.1/tcp/4001/p2p/${A}, /ip4/10.0.0.2/tcp/4001/p2p/${B}`);
    assert.deepEqual(v.ids(), [A, B]);
    const first = v.current;
    v.failed(first);
    assert.match(v.current.toString(), new RegExp(B));
    // a second request failing on the same address moves nothing more
    v.failed(first);
    assert.match(v.current.toString(), new RegExp(B));
    assert.deepEqual(v.all.map((m) => m.toString().slice(-6)), [B.slice(-6), A.slice(-6)]);
    v.failed(v.current);
    assert.equal(v.current, first);
  });

  test('learns the validators a status answer lists: its own address, a routable one first; not through a relay, not one naming another peer', () => {
    const v = Validators.parse(`/ip4/10.0.0.1/tcp/4001/p2p/${A}`);
    v.learn([
      { peerId: B, roles: ['validator'], addrs: [`/ip4/127.0.0.1/tcp/5/p2p/${B}`, `/ip4/203.0.113.9/tcp/5/p2p/${B}`] },
      { peerId: C, roles: ['validator'], addrs: [`/ip4/203.0.113.1/tcp/5/p2p/${A}/p2p-circuit/p2p/${C}`, `/ip4/203.0.113.2/tcp/5/p2p/${A}`] },
      { peerId: A, roles: ['validator'], addrs: ['/ip4/203.0.113.3/tcp/5'] },
      { peerId: C, roles: ['worker'], addrs: ['/ip4/203.0.113.4/tcp/5'] },
    ]);
    assert.deepEqual(v.ids(), [A, B]);
    assert.equal(v.all[1].toString(), `/ip4/203.0.113.9/tcp/5/p2p/${B}`);
  });

  test('an address without /p2p/ is dialled as given; a list of nothing, or of something not an address, is refused', () => {
    assert.equal(Validators.parse('/ip4/10.0.0.1/tcp/4001').ids().length, 0);
    assert.throws(() => Validators.parse(' , '), { name: 'InvalidArgumentError' });
    assert.throws(() => Validators.parse('validator.example:4001'), { name: 'InvalidArgumentError', message: /is not a multiaddr/ });
  });
});
