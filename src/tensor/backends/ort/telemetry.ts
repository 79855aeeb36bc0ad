/**
 * onnxruntime 1.30 starts Microsoft's 1DS telemetry when a process creates its first OrtEnv,
 * unless ORT_DISABLE_TELEMETRY is set then: it opens an empty /tmp/mat-debug-<pid>.log (kept
 * open until exit, never written), writes a device id and a database under
 * ~/.cache/Microsoft/DeveloperTools/.onnxruntime and /tmp/.ses, and looks up
 * mobile.events.data.microsoft.com to upload. A worker lends its compute, not its usage data:
 * both ways into onnxruntime (binding.ts, ffi.ts) call this before they create the env.
 * The variable is read at that first CreateEnv, not when the library loads. A value the
 * operator set is kept (ORT_DISABLE_TELEMETRY=0 turns telemetry back on).
 */
export function disableOrtTelemetry(): void {
  process.env.ORT_DISABLE_TELEMETRY ??= '1';
}
