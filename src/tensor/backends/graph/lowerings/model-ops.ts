import type { LoweringTable } from '../lowerings.ts';

export const MODEL_OPS: LoweringTable = {};
