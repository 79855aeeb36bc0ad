/**
 * Text as tokens come, for a reader that must never be shown what it will later be told was
 * not there: a stop string is cut with everything after it, and the text that might be the
 * start of a stop string (or half of a multi-byte character) is held back until the next
 * token decides.
 */
export class TextStream {
  private tokens: number[] = [];
  private shown = 0;
  /** Why the text ended: a stop string was reached. */
  stopped = false;

  constructor(
    private readonly decode: (ids: readonly number[]) => string,
    private readonly stops: readonly string[],
  ) {}

  /** The whole text so far, cut at the first stop string. */
  text(): string {
    const full = this.decode(this.tokens);
    let cut = full.length;
    for (const s of this.stops) {
      const at = full.indexOf(s);
      if (at >= 0 && at < cut) cut = at;
    }
    this.stopped = cut < full.length;
    return full.slice(0, cut);
  }

  /** Adds a token; returns the new text that is safe to show (maybe ''). */
  push(token: number): string {
    this.tokens.push(token);
    const text = this.text();
    const safe = this.stopped ? text.length : text.length - this.heldBack(text);
    if (safe <= this.shown) return '';
    const out = text.slice(this.shown, safe);
    this.shown = safe;
    return out;
  }

  /** What is left to show once no more tokens come. */
  flush(): string {
    const text = this.text();
    const out = text.slice(this.shown);
    this.shown = text.length;
    return out;
  }

  /** How many trailing characters of `text` may still turn out to begin a stop string, or are an incomplete character. */
  private heldBack(text: string): number {
    let hold = text.endsWith('\uFFFD') ? 1 : 0;
    for (const s of this.stops) {
      for (let n = Math.min(s.length - 1, text.length); n > hold; n--) {
        if (text.endsWith(s.slice(0, n))) {
          hold = n;
          break;
        }
      }
    }
    return hold;
  }
}
