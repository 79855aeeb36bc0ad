#!/usr/bin/env bash
# The GPU bench of #46 in one go (bench/gpu/README.md): run from the repository's root.
#   bash bench/gpu/run.sh [--allow-software] [--only ours,llama,torch] [--budget S] [--size 1b|tiny]
# Budget: 10 minutes on an H100 or H200 in all: unpacking ~10 s, then bench.ts stops starting sections
# past --budget (default 480 s) and says which it skipped.
# What it needs there comes from bench/out/gpu-carry/ (bench/gpu/pack.sh made it on a machine with a registry):
# core.tar.xz (Node, onnxruntime-node, the bundled bench, the Vulkan loader) and llama.tar.xz (node-llama-cpp,
# Vulkan), unpacked into /tmp/tensorlink-gpu (kept there while the machine is held: a second call needs not carry
# core again). Without them (a checkout with node_modules, as here) it runs bench/gpu/bench.ts through tsx.
# The webgpu backend must find the NVIDIA GPU through Vulkan: NVIDIA's Vulkan driver (ICD) is looked for where
# the driver's files are mounted; a software adapter (SwiftShader) is refused unless --allow-software is given.
# Results: $OUT/gpu-bench.json and $OUT/gpu-bench.log where OUT is set (the device tool's), else bench/out/gpu/.
set -uo pipefail
cd "$(dirname "$0")/../.."
allow_software=0
for a in "$@"; do [ "$a" = "--allow-software" ] && allow_software=1; done
out=${OUT:-bench/out/gpu}
mkdir -p "$out"
log="$out/gpu-bench.log"
say() { echo "[run.sh] $*" | tee -a "$log" >&2; }
: >"$log"

t=${TL_CARRY:-/tmp/tensorlink-gpu}
export TL_CARRY=$t
for part in core llama; do
  if [ -f "bench/out/gpu-carry/$part.tar.xz" ]; then
    rm -rf "${t:?}/$part" && mkdir -p "$t/$part" && tar -xJf "bench/out/gpu-carry/$part.tar.xz" -C "$t/$part" && say "unpacked $part.tar.xz into $t/$part"
  elif [ -d "$t/$part" ]; then
    say "using $t/$part unpacked by an earlier call"
  fi
done
[ -f "$t/core/commit.txt" ] && say "bundle packed from: $(tr '\n' ';' <"$t/core/commit.txt")"

# Node: the machine's if it is 20 or later, else the carried one
node_bin=$(command -v node || true)
if [ -z "$node_bin" ] || [ "$("$node_bin" -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)" -lt 20 ]; then node_bin="$t/core/bin/node"; fi
[ -x "$node_bin" ] || { say "no Node 20+ here and none carried: run bench/gpu/pack.sh and carry bench/out/gpu-carry/core.tar.xz"; exit 1; }
say "node: $node_bin ($("$node_bin" -v))"

# the Vulkan loader: the machine's, else the carried .deb files unpacked beside the bundle (not into /)
if ! ldconfig -p 2>/dev/null | grep -q 'libvulkan.so.1 '; then
  if ls "$t"/core/deb/*.deb >/dev/null 2>&1; then
    for f in "$t"/core/deb/*.deb; do dpkg -x "$f" "$t/vulkan"; done
    export LD_LIBRARY_PATH="$t/vulkan/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    say "Vulkan loader: carried ($t/vulkan)"
  else
    say "no Vulkan loader (libvulkan.so.1) in ldconfig's cache and none carried (LD_LIBRARY_PATH may still hold one)"
  fi
fi

# NVIDIA's Vulkan driver: where the driver's files are mounted, else where a distribution puts it
icd=""
for f in ${VK_ICD_FILENAMES:-} ${VK_DRIVER_FILES:-} /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.json \
  /etc/vulkan/icd.d/nvidia_icd.json; do
  if [ -f "$f" ] && grep -qi nvidia "$f"; then icd=$f; break; fi
done
if [ -n "$icd" ]; then
  export VK_ICD_FILENAMES=$icd VK_DRIVER_FILES=$icd
  for d in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done
  say "Vulkan driver: $icd"
elif [ "$allow_software" = 1 ] && [ -f /usr/lib/chromium/vk_swiftshader_icd.json ]; then
  export VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json VK_DRIVER_FILES=/usr/lib/chromium/vk_swiftshader_icd.json
  export LD_LIBRARY_PATH="/usr/lib/chromium${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "Vulkan driver: SwiftShader (software, --allow-software)"
else
  say "no NVIDIA Vulkan driver (nvidia_icd.json) found; the bench will say which adapter it got"
fi
say "nvidia-smi: $(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo 'not here')"

export TL_WORK=${TL_WORK:-/tmp/tensorlink-gpu-bench}
if [ -f "$t/core/bench.mjs" ]; then
  cmd=("$node_bin" "$t/core/bench.mjs")
else
  cmd=("$node_bin" --import tsx bench/gpu/bench.ts)
fi
say "running ${cmd[*]} $*"
"${cmd[@]}" "$@" 2>&1 | tee -a "$log"
exit "${PIPESTATUS[0]}"
