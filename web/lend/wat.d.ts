// A `.wat` import is its assembled module's bytes (scripts/build-dashboard.mjs assembles it with wabt).
declare module '*.wat' {
  const bytes: Uint8Array<ArrayBuffer>;
  export default bytes;
}
