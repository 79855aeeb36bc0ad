import type { LoweringTable } from '../lowerings.ts';

export const SHAPES: LoweringTable = {};
