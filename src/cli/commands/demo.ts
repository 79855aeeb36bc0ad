import { type Flags, intFlag } from '../args.ts';
import { runEngineDemo } from '../engine-demo.ts';
import { bar, type Output } from '../output.ts';

export const demoOptions = { steps: { type: 'string' }, seed: { type: 'string' } } as const;

/** `tensorlink demo`: the single-process engine showcase (until the swarm demo lands). */
export async function demoCommand(flags: Flags, out: Output): Promise<void> {
  const steps = intFlag(flags, 'steps', 800);
  const seed = intFlag(flags, 'seed', 1, 0);
  out.info(`TensorLink engine demo: learning 2-digit addition (${steps} steps, seed ${seed})`);
  const result = runEngineDemo({
    steps,
    batch: 128,
    seed,
    onProgress: (step, loss, lr) => {
      out.progress(`${bar(step / steps)} step ${step}/${steps}  loss ${loss.toFixed(4)}  lr ${lr.toExponential(2)}`);
      if (step % Math.max(1, Math.floor(steps / 4)) === 0 || step === steps) out.info(`step ${String(step).padStart(5)}  loss ${loss.toFixed(4)}`);
    },
  });
  const lines = [
    ...result.examples.map(
      (e) => `  ${e.question.padStart(6)} = ${String(e.predicted).padEnd(4)} ${e.predicted === e.answer ? 'right' : `wrong (${e.answer})`}`,
    ),
    `exact match on ${result.heldOut} held-out sums: ${(100 * result.accuracy).toFixed(1)}%`,
    `${result.parameters} parameters, ${result.steps} steps in ${result.seconds.toFixed(1)} s on the ${result.backend} backend`,
  ];
  out.result(result, lines.join('\n'));
}
