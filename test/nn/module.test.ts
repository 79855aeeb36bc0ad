import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import {
  AdamW,
  Dropout,
  Embedding,
  LayerNorm,
  Linear,
  Module,
  ModuleList,
  RMSNorm,
} from '../../src/nn/index.ts';
import {
  type Allocator, type Backend, crossEntropy, type DType, Generator, jsBackend, registerBackend, setBackend, type Tensor, tensor,
  type TypedArray,
} from '../../src/tensor/index.ts';

/** A device for this file: host arrays behind numbered handles, so that a module's parameters can live off the host. */
const memory = new Map<number, TypedArray>();
let handles = 0;
const allocator: Allocator<number> = {
  alloc: (dtype: DType, length: number) => {
    memory.set(++handles, dtype === 'int32' ? new Int32Array(length) : dtype === 'float64' ? new Float64Array(length) : new Float32Array(length));
    return handles;
  },
  copyin: (handle, src) => void memory.get(handle)!.set(src),
  copyout: async (handle, dst) => void dst.set(memory.get(handle)!),
  free: (handle) => void memory.delete(handle),
};
registerBackend('module-test-device', () => ({ ...jsBackend, name: 'module-test-device', device: 'module-test-device', allocator }) as Backend);

class Block extends Module {
  readonly ln: LayerNorm;
  readonly fc: Linear;
  constructor(dim: number, rng: Generator) {
    super();
    this.ln = this.addModule('ln', new LayerNorm(dim));
    this.fc = this.addModule('fc', new Linear(dim, dim, { rng }));
  }

  forward(x: Tensor): Tensor {
    return x.add(this.fc.forward(this.ln.forward(x)).gelu());
  }
}

class Tiny extends Module {
  readonly wte: Embedding;
  readonly h: ModuleList<Block>;
  readonly norm: RMSNorm;
  readonly head: Linear;
  readonly drop: Dropout;
  constructor(seed: number, vocab = 100, dim = 16, classes = 10) {
    super();
    const rng = new Generator(seed);
    this.wte = this.addModule('wte', new Embedding(vocab, dim, { rng, std: 0.1 }));
    this.h = this.addModule('h', new ModuleList([new Block(dim, rng), new Block(dim, rng)]));
    this.norm = this.addModule('norm', new RMSNorm(dim));
    this.head = this.addModule('head', new Linear(dim, classes, { rng, bias: false }));
    this.drop = this.addModule('drop', new Dropout(0.1, new Generator(seed + 1)));
  }

  forward(ids: Tensor): Tensor {
    let x = this.drop.forward(this.wte.forward(ids));
    for (const block of this.h) x = block.forward(x);
    return this.head.forward(this.norm.forward(x));
  }
}

/** Trains the tiny model to predict (a + b) mod 10 from the pair's token a·10 + b; returns the losses. */
function train(seed: number, steps: number): { losses: number[]; model: Tiny } {
  const model = new Tiny(seed);
  const opt = new AdamW(model.parameters(), { lr: 0.02 });
  const data = new Generator(7);
  const losses: number[] = [];
  for (let s = 0; s < steps; s++) {
    const ids: number[] = [];
    const targets: number[] = [];
    for (let b = 0; b < 16; b++) {
      const [x, y] = [data.int(10), data.int(10)];
      ids.push(x * 10 + y, 0);
      targets.push((x + y) % 10, -100);
    }
    const logits = model.forward(tensor(ids, [16, 2], 'int32'));
    const loss = crossEntropy(logits, tensor(targets, [16, 2], 'int32'));
    loss.backward();
    opt.step();
    opt.zeroGrad();
    losses.push(loss.item());
  }
  return { losses, model };
}

describe('Module', () => {
  setBackend('js');

  test('parameter names follow the module tree, in registration order', () => {
    const names = [...new Tiny(0).namedParameters()].map(([n]) => n);
    assert.deepEqual(names, [
      'wte.weight',
      'h.0.ln.weight',
      'h.0.ln.bias',
      'h.0.fc.weight',
      'h.0.fc.bias',
      'h.1.ln.weight',
      'h.1.ln.bias',
      'h.1.fc.weight',
      'h.1.fc.bias',
      'norm.weight',
      'head.weight',
    ]);
  });

  test('the same seed builds the same weights; another seed does not', () => {
    const [a, b, c] = [new Tiny(3), new Tiny(3), new Tiny(4)];
    assert.deepEqual(a.head.weight.data, b.head.weight.data);
    assert.notDeepEqual(a.head.weight.data, c.head.weight.data);
  });

  test('state dicts load key for key and name what does not fit', () => {
    const a = new Tiny(1);
    const b = new Tiny(2);
    b.loadStateDict(a.stateDict());
    assert.deepEqual(b.h.at(1).fc.weight.data, a.h.at(1).fc.weight.data);
    const partial = a.stateDict();
    partial.delete('norm.weight');
    partial.set('extra', tensor([1]));
    assert.throws(
      () => b.loadStateDict(partial),
      (err: Error & { details: Record<string, unknown> }) => {
        assert.equal(err.name, 'StateDictError');
        assert.deepEqual(err.details.missing, ['norm.weight']);
        assert.deepEqual(err.details.unexpected, ['extra']);
        return true;
      },
    );
    const wrong = a.stateDict();
    wrong.set('head.weight', tensor([1, 2], [1, 2]));
    assert.throws(() => b.loadStateDict(wrong), { name: 'StateDictError', message: /head\.weight/ });
  });

  test('tied parameters are listed once but saved under both names', () => {
    class Tied extends Module {
      readonly emb: Embedding;
      readonly out: Linear;
      constructor() {
        super();
        const rng = new Generator(0);
        this.emb = this.addModule('emb', new Embedding(4, 3, { rng }));
        this.out = this.addModule('out', new Linear(3, 4, { rng, bias: false }));
        (this.out as unknown as { weight: Tensor }).weight = this.emb.weight;
      }
    }
    const m = new Tied();
    assert.equal(m.parameters().length, 2);
  });

  test('a small model learns modular addition, and training is bitwise reproducible', () => {
    const first = train(11, 150);
    const second = train(11, 150);
    assert.deepEqual(first.losses, second.losses);
    const tail = first.losses.slice(-10).reduce((a, b) => a + b, 0) / 10;
    assert.ok(first.losses[0] > 2, `initial loss ${first.losses[0]}`);
    assert.ok(tail < 0.3, `final loss ${tail}`);
  });

  test('eval() turns dropout off', () => {
    const m = new Tiny(5).eval();
    const ids = tensor([1, 2, 3, 4], [2, 2], 'int32');
    assert.deepEqual(m.forward(ids).data, m.forward(ids).data);
    m.train();
    assert.notDeepEqual(m.forward(ids).data, m.forward(ids).data);
  });

  test('a module knows its device: where its parameters live, a typed error when they are split', () => {
    class Two extends Module {
      constructor(a: Tensor, b: Tensor) {
        super();
        this.addParameter('a', a);
        this.addParameter('b', b);
      }
    }
    const host = () => tensor([1, 2], [2]);
    assert.equal(new Two(host(), host()).device, 'cpu');
    assert.equal(new Linear(2, 2, { rng: new Generator(0) }).device, 'cpu');
    const onDevice = new Two(host().to('module-test-device'), host().to('module-test-device'));
    assert.equal(onDevice.device, 'module-test-device');
    assert.throws(() => new Two(host(), host().to('module-test-device')).device, { name: 'DeviceMismatchError' });
  });
});
