import type { LoweringTable } from '../lowerings.ts';

export const PRODUCTS: LoweringTable = {};
