import type { LoweringTable } from '../lowerings.ts';

export const REDUCTIONS: LoweringTable = {};
