// What the engine's modules take from Node's globals, for a tab: `setImmediate` (yielding to the event loop between
// pieces of work), by a MessageChannel (a 0 ms timer is clamped to 4 ms once nested). Imported first by the page.
type Callback = (...args: unknown[]) => void;
const g = globalThis as unknown as { setImmediate?: (fn: Callback, ...args: unknown[]) => unknown };
if (typeof g.setImmediate !== 'function') {
  const queue: (() => void)[] = [];
  const channel = new MessageChannel();
  channel.port1.onmessage = () => queue.shift()?.();
  g.setImmediate = (fn: Callback, ...args: unknown[]) => {
    queue.push(() => fn(...args));
    channel.port2.postMessage(null);
  };
}
