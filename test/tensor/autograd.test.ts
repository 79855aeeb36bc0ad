import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { noGrad, randn, setBackend, type Tensor, tensor } from '../../src/tensor/index.ts';

describe('autograd', () => {
  setBackend('js');

  test('a tensor used twice gets both contributions', () => {
    const x = tensor([1, 2, 3]);
    x.requiresGrad = true;
    x.mul(x).sum().backward();
    assert.deepEqual(x.grad?.toArray(), [2, 4, 6]);
  });

  test('gradients accumulate across backward calls until reset', () => {
    const x = tensor([1, 2]);
    x.requiresGrad = true;
    x.mul(3).sum().backward();
    x.mul(3).sum().backward();
    assert.deepEqual(x.grad?.toArray(), [6, 6]);
    x.grad = null;
    x.mul(2).sum().backward();
    assert.deepEqual((x.grad as Tensor | null)?.toArray(), [2, 2]);
  });

  test('leaf gradients do not alias each other', () => {
    const a = tensor([1, 2]);
    const b = tensor([3, 4]);
    a.requiresGrad = true;
    b.requiresGrad = true;
    a.add(b).sum().backward();
    a.grad!.data[0] = 100;
    assert.deepEqual(b.grad?.toArray(), [1, 1]);
  });

  test('noGrad records nothing; detach cuts the graph', () => {
    const x = tensor([1, 2]);
    x.requiresGrad = true;
    const y = noGrad(() => x.mul(2));
    assert.equal(y.requiresGrad, false);
    assert.equal(y.node, null);
    const z = x.mul(2).detach();
    assert.equal(z.requiresGrad, false);
    assert.throws(() => z.sum().backward(), { name: 'AutogradError' });
  });

  test('the graph is freed after backward unless retained', () => {
    const x = tensor([1, 2]);
    x.requiresGrad = true;
    const y = x.exp().sum();
    y.backward(undefined, { retainGraph: true });
    y.backward();
    assert.ok(Math.abs(x.grad!.data[0] - 2 * Math.E) < 1e-5);
    assert.throws(() => y.backward(), { name: 'AutogradError' });
  });

  test('backward of a non-scalar needs an explicit gradient', () => {
    const x = tensor([1, 2]);
    x.requiresGrad = true;
    const y = x.mul(2);
    assert.throws(() => y.backward(), { name: 'AutogradError' });
    y.backward(tensor([1, 10]));
    assert.deepEqual(x.grad?.toArray(), [2, 20]);
  });

  test('an input leaf (a received activation) gets the gradient to send upstream', () => {
    const w = randn([3, 3], { seed: 1 });
    w.requiresGrad = true;
    const h = randn([2, 3], { seed: 2 });
    h.requiresGrad = true;
    h.matmul(w).tanh().sum().backward();
    assert.deepEqual([...h.grad!.shape], [2, 3]);
    assert.deepEqual([...w.grad!.shape], [3, 3]);
  });

  test('integer tensors cannot require grad', () => {
    const ids = tensor([1, 2], [2], 'int32');
    assert.throws(
      () => {
        ids.requiresGrad = true;
      },
      { name: 'DTypeError' },
    );
  });

  test('deep chains do not overflow the stack', () => {
    const x = tensor([0.5]);
    x.requiresGrad = true;
    let y = x;
    for (let i = 0; i < 20000; i++) y = y.mul(1);
    y.sum().backward();
    assert.deepEqual(x.grad?.toArray(), [1]);
  });
});
