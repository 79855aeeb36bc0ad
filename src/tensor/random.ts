/**
 * Seeded random numbers that are identical on every machine: a 32-bit xoshiro128**
 * generator seeded through splitmix32, uniform floats from 24 bits, normals by
 * Box–Muller. Only integer math and IEEE double arithmetic (no platform RNG).
 */
export class Generator {
  private s0: number;
  private s1: number;
  private s2: number;
  private s3: number;
  private spare: number | null = null;

  constructor(seed = 0) {
    let x = seed >>> 0;
    const next = () => {
      x = (x + 0x9e3779b9) >>> 0;
      let z = x;
      z = Math.imul(z ^ (z >>> 16), 0x85ebca6b) >>> 0;
      z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35) >>> 0;
      return (z ^ (z >>> 16)) >>> 0;
    };
    this.s0 = next();
    this.s1 = next();
    this.s2 = next();
    this.s3 = next();
  }

  /** The generator's position, to save and restore (resume a job exactly). */
  getState(): number[] {
    return [this.s0, this.s1, this.s2, this.s3, this.spare ?? Number.NaN];
  }

  setState(state: readonly number[]): void {
    [this.s0, this.s1, this.s2, this.s3] = state.map((v) => v >>> 0);
    this.spare = Number.isNaN(state[4]) ? null : state[4];
  }

  /** A uniform 32-bit unsigned integer. */
  nextUint32(): number {
    const result = Math.imul(rotl(Math.imul(this.s1, 5) >>> 0, 7), 9) >>> 0;
    const t = (this.s1 << 9) >>> 0;
    this.s2 ^= this.s0;
    this.s3 ^= this.s1;
    this.s1 ^= this.s2;
    this.s0 ^= this.s3;
    this.s2 ^= t;
    this.s3 = rotl(this.s3, 11);
    this.s0 >>>= 0;
    this.s1 >>>= 0;
    this.s2 >>>= 0;
    return result;
  }

  /** Uniform in [0, 1) with 24 random bits (exactly representable in float32). */
  uniform(): number {
    return (this.nextUint32() >>> 8) / 16777216;
  }

  /** Standard normal by Box–Muller, using both values of each pair. */
  normal(): number {
    if (this.spare !== null) {
      const s = this.spare;
      this.spare = null;
      return s;
    }
    const u1 = 1 - this.uniform();
    const u2 = this.uniform();
    const r = Math.sqrt(-2 * Math.log(u1));
    this.spare = r * Math.sin(2 * Math.PI * u2);
    return r * Math.cos(2 * Math.PI * u2);
  }

  /** An integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.uniform() * n);
  }

  /** Fisher–Yates shuffle in place. */
  shuffle<T>(items: T[]): T[] {
    for (let i = items.length - 1; i > 0; i--) {
      const j = this.int(i + 1);
      [items[i], items[j]] = [items[j], items[i]];
    }
    return items;
  }
}

function rotl(x: number, k: number): number {
  return ((x << k) | (x >>> (32 - k))) >>> 0;
}

/**
 * A generator that yields only zeros: builds a module's parameters without paying for
 * random numbers when they will be overwritten at once (loading a checkpoint).
 */
export class ZeroGenerator extends Generator {
  /** Tensors "drawn" from it are left as allocated: zeros whose memory is untouched until a checkpoint fills it. */
  readonly blank = true;

  override uniform(): number {
    return 0;
  }

  override normal(): number {
    return 0;
  }
}
