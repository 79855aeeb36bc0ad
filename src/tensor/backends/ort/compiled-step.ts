import { allocate, type DType } from '../../dtype.ts';
import { Tensor } from '../../tensor.ts';
import type { CompiledStep, TracedStep } from '../../trace.ts';
import { lowerStep } from '../graph/step-graph.ts';
import { applyTrainingOutputs } from '../graph/step-training.ts';
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
      for (const guard of lowered.effects.guards) guard();
      const feeds = lowered.inputs.map(({ name, slot }) => {
        const t = slot < step.inputCount ? inputs[slot] : step.slots[slot].tensor!;
        return { name, data: t.data as Float32Array | Int32Array, dims: t.shape };
      });
      // a training step's moments (read in place) and its hyper-parameters for this run
      for (const e of lowered.extraInputs) feeds.push({ name: e.name, data: e.source, dims: e.shape });
      for (const f of lowered.feeds) feeds.push({ name: f.name, data: f.value(), dims: f.shape });
      const outs = lowered.outputs.map((o) => new Tensor(allocate(o.type as DType, o.shape.reduce((a, d) => a * d, 1)), [...o.shape]));
      const trained = lowered.training.map((o) => new Float32Array(o.shape.reduce((a, d) => a * d, 1)));
      session.run(feeds, [
        ...lowered.outputs.map((o, i) => ({ name: o.name, data: outs[i].data as Float32Array | Int32Array, dims: o.shape })),
        ...lowered.training.map((o, i) => ({ name: o.name, data: trained[i], dims: o.shape })),
      ]);
      applyTrainingOutputs(lowered.training, trained, inputs, lowered.effects.clears);
      return outs;
    },
  };
}
