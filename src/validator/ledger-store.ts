import { appendFileSync, closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, truncateSync } from 'node:fs';
import { join } from 'node:path';
import { InvalidArgumentError } from '../errors.ts';
import { type Block, type BlockHeader, blockProblem, headerHash, parseLedgerRecord, type SignerSet } from '../ledger/index.ts';

/** Where a validator keeps its blocks under `--data`: one JSON line per block, in height order. */
export const BLOCKS_FILE = join('ledger', 'blocks.jsonl');

/**
 * A validator's blocks, persisted as they are accepted: each block is appended as one line and
 * synced to disk before `append` returns, so a restart loses nothing that was acknowledged. On
 * opening, every block is checked against the one before (root, link, signatures); a last line
 * cut short by a crash is dropped, and anything else that does not check is a typed error.
 */
export class LedgerStore {
  private readonly blocks: Block[] = [];
  private readonly path: string | null;

  /** `dataDir` undefined: blocks are kept in memory only. */
  constructor(dataDir: string | undefined, private readonly signers: SignerSet) {
    this.path = dataDir ? join(dataDir, BLOCKS_FILE) : null;
    if (!this.path || !existsSync(this.path)) return;
    const text = readFileSync(this.path, 'utf8');
    const lines = text.split('\n');
    let offset = 0;
    for (const [i, line] of lines.entries()) {
      if (line === '') {
        offset += 1;
        continue;
      }
      const last = i === lines.length - 1;
      let block: Block;
      try {
        block = parseBlock(JSON.parse(line));
      } catch (err) {
        if (last) {
          // a last line without its newline was cut short by a crash: it was never acknowledged, and is dropped
          truncateSync(this.path, offset);
          break;
        }
        throw new InvalidArgumentError(`${this.path}, line ${i + 1}: not a block (${(err as Error).message}); move the file away to start the ledger afresh`);
      }
      const problem = blockProblem(block, this.blocks.at(-1)?.header ?? null, this.signers);
      if (problem) throw new InvalidArgumentError(`${this.path}, line ${i + 1}: ${problem}`);
      this.blocks.push(block);
      offset += Buffer.byteLength(line) + 1;
    }
  }

  get height(): number {
    return this.blocks.length;
  }

  get head(): BlockHeader | null {
    return this.blocks.at(-1)?.header ?? null;
  }

  at(height: number): Block | undefined {
    return this.blocks[height];
  }

  /** Blocks from `height` on (a peer catching up). */
  from(height: number): Block[] {
    return this.blocks.slice(Math.max(0, height));
  }

  /**
   * Adds the next block, once it checks against the head; synced to disk before this returns.
   * `recordsChecked`: its records' signatures were checked already (a block this validator made).
   */
  append(block: Block, recordsChecked = false): void {
    const problem = blockProblem(block, this.head, this.signers, { recordsChecked });
    if (problem) throw new InvalidArgumentError(`block refused: ${problem}`);
    if (this.path) {
      mkdirSync(join(this.path, '..'), { recursive: true });
      appendFileSync(this.path, `${JSON.stringify(block)}\n`);
      const fd = openSync(this.path, 'r');
      try {
        fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
    }
    this.blocks.push(block);
  }

  /** The hash of the head's header ('' before the first block). */
  headHash(): string {
    return this.head ? headerHash(this.head) : '';
  }
}

/** A block as read from disk or from a peer: every field typed, every record parsed. */
export function parseBlock(v: unknown): Block {
  const m = (typeof v === 'object' && v !== null ? v : {}) as Record<string, unknown>;
  const h = (typeof m.header === 'object' && m.header !== null ? m.header : {}) as Record<string, unknown>;
  const int = (x: unknown, what: string) => {
    if (!Number.isSafeInteger(x) || (x as number) < 0) throw new InvalidArgumentError(`header.${what} must be a non-negative integer`);
    return x as number;
  };
  const str = (x: unknown, what: string) => {
    if (typeof x !== 'string' || x.length > 200) throw new InvalidArgumentError(`${what} must be a string`);
    return x;
  };
  if (!Array.isArray(m.records) || !Array.isArray(m.signatures)) throw new InvalidArgumentError('a block has records and signatures');
  return {
    header: { height: int(h.height, 'height'), prev: str(h.prev, 'header.prev'), root: str(h.root, 'header.root'), count: int(h.count, 'count'), time: int(h.time, 'time') },
    signatures: m.signatures.map((s: { validator?: unknown; sig?: unknown }) => ({ validator: str(s?.validator, 'validator'), sig: str(s?.sig, 'sig') })),
    records: m.records.map(parseLedgerRecord),
  };
}
