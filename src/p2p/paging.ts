/** Items one page of a validator's answer (status, models) holds at most. */
export const PAGE_ITEMS = 100;
/** JSON bytes one page's items take at most: well inside a control message (MAX_CONTROL_BYTES), whatever an item holds. */
export const PAGE_BYTES = 512 * 1024;

/**
 * The page of `items` that starts at `cursor` (0 first): as many as fit PAGE_ITEMS and PAGE_BYTES of JSON (at least
 * one), and `next`, the cursor of the following page, when items are left. A cursor past the end gives an empty page.
 */
export function pageOf<T>(
  items: readonly T[], cursor: number, limits = { items: PAGE_ITEMS, bytes: PAGE_BYTES },
): { items: T[]; next?: number } {
  const out: T[] = [];
  let bytes = 0;
  let i = cursor;
  for (; i < items.length && out.length < limits.items; i++) {
    const size = JSON.stringify(items[i]).length;
    if (out.length > 0 && bytes + size > limits.bytes) break;
    out.push(items[i]);
    bytes += size;
  }
  return i < items.length ? { items: out, next: i } : { items: out };
}
