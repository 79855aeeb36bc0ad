import { openSync, readSync } from 'node:fs';
import { FileNotFoundError } from '../errors.ts';

/** Bytes read or converted per step by the checkpoint readers: bounds the temporary memory of a load. */
export const READ_CHUNK_BYTES = 16 * 1024 * 1024;

/** A file opened for reading, or a FileNotFoundError that names it. */
export function openFile(path: string): number {
  try {
    return openSync(path, 'r');
  } catch (cause) {
    throw new FileNotFoundError(`cannot open '${path}'`, { cause });
  }
}

/**
 * Fills `target` from `position` of the file, READ_CHUNK_BYTES at a time; a file that ends first is
 * the format's error (`early`, given `${where}: file ends early`).
 */
export function readExactly(fd: number, target: Uint8Array, position: number, where: string, early: (message: string) => Error): void {
  let done = 0;
  while (done < target.length) {
    const n = readSync(fd, target, done, Math.min(READ_CHUNK_BYTES, target.length - done), position + done);
    if (n === 0) throw early(`${where}: file ends early`);
    done += n;
  }
}
