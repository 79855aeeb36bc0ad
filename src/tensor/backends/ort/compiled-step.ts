import { allocate, type DType } from '../../dtype.ts';
import { addInto } from '../../kernels/rows.ts';
import { Tensor } from '../../tensor.ts';
import type { CompiledStep, TracedStep } from '../../trace.ts';
import { lowerStep } from '../graph/step-graph.ts';
import type { OrtSession } from './runtime.ts';

/**
 * A traced step as one ONNX graph on onnxruntime's CPU provider (ort's Backend.compileStep):
 * one native call per step instead of one per op and the js glue between them. Inputs,
 * constants and outputs are host buffers that onnxruntime reads and writes in place (the ffi
 * runtime), so parameters are fed by reference at each run. Returns null, and the step
 * replays op by op, where the step has an op without a lowering or a float64 value; `refusal`
 * hears why.
 * @example
 * const compiled = compileOrtStep(step, (model) => ort.session(model, 2, false))
 */
export function compileOrtStep(
  step: TracedStep,
  open: (model: Uint8Array) => OrtSession,
  refusal?: (why: string) => void,
): CompiledStep | null {
  if (step.slots.some((s) => s.device !== 'cpu')) return null;
  const lowered = lowerStep(step);
  if ('refused' in lowered) {
    refusal?.(lowered.refused);
    return null;
  }
  const session = open(lowered.model);
  return {
    run(inputs) {
      const feeds = lowered.inputs.map(({ name, slot }) => {
        const t = slot < step.inputCount ? inputs[slot] : step.slots[slot].tensor!;
        return { name, data: t.data as Float32Array | Int32Array, dims: t.shape };
      });
      const outs = lowered.outputs.map((o) => new Tensor(allocate(o.type as DType, o.shape.reduce((a, d) => a * d, 1)), [...o.shape]));
      const grads = lowered.gradients.map((o) => new Float32Array(o.tensor.size));
      session.run(feeds, [
        ...lowered.outputs.map((o, i) => ({ name: o.name, data: outs[i].data as Float32Array | Int32Array, dims: o.shape })),
        ...lowered.gradients.map((o, i) => ({ name: o.name, data: grads[i], dims: o.shape })),
      ]);
      // backward in the step: its gradients added into the parameters' .grad, as backward() does
      lowered.gradients.forEach(({ tensor: p }, i) => {
        if (p.grad === null) p.grad = new Tensor(grads[i], p.shape);
        else addInto(p.grad.data as Float32Array, grads[i]);
      });
      return outs;
    },
  };
}
