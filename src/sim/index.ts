export { VirtualClock } from './clock.ts';
export { reportSvg } from './plot.ts';
export { SIM_MODELS, simulateSwarm, type SimulateOptions, type SimulationReport } from './simulate.ts';
export { chooseSpan, type Spans } from './hosted.ts';
export { placeTraining } from './training.ts';
