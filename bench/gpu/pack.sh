#!/usr/bin/env bash
# Packs what bench/gpu/run.sh needs on a GPU machine that reaches no registry (README.md beside this), into
# bench/out/gpu-carry/ (ignored by git), from this machine's checkout (x86-64 Linux, `npm ci` done):
#   core.tar.xz   ~35 MB: Node (this one, stripped), onnxruntime-node cut to linux-x64 and onnxruntime-common,
#                 the bench bundled by esbuild (bench.mjs, llama-child.mjs), the Vulkan loader's .deb files
#   llama.tar.xz  ~10 MB: node-llama-cpp with its Vulkan build only (from `npm ci --prefix bench/llama-cpp`)
# The device tool carries at most 64 MiB with the working tree: this prints the sizes and what fits.
# Re-run it after changing src/ or bench/gpu/: the bundle is the code as it was when packed.
# usage: bash bench/gpu/pack.sh [--no-llama] [--no-node]   (--no-node: the GPU machine has Node 20+ of its own)
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=bench/out/gpu-carry
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
rm -rf "$carry" && mkdir -p "$carry" "$stage/core/bin" "$stage/core/node_modules" "$stage/core/deb"

echo "bundling the bench (esbuild) ..."
npx esbuild bench/gpu/bench.ts bench/gpu/llama-child.ts --bundle --platform=node --format=esm --target=node20 \
  --outdir="$stage/core" --out-extension:.js=.mjs --external:onnxruntime-node --external:onnxruntime-common --log-level=warning \
  --banner:js="import { createRequire as __tlRequire } from 'node:module'; const require = __tlRequire(import.meta.url);"
git log -1 --format='%h %s' >"$stage/core/commit.txt"
git status --porcelain -- src bench/gpu | sed 's/^/uncommitted: /' >>"$stage/core/commit.txt"

if [[ " $* " != *" --no-node "* ]]; then
  echo "Node $(node -v), stripped ..."
  cp "$(command -v node)" "$stage/core/bin/node" && strip "$stage/core/bin/node"
fi

echo "onnxruntime-node (linux-x64 only) ..."
ort=node_modules/onnxruntime-node
mkdir -p "$stage/core/$ort/bin/napi-v6/linux"
cp -r "$ort/package.json" "$ort/dist" "$stage/core/$ort/"
cp -r "$ort/bin/napi-v6/linux/x64" "$stage/core/$ort/bin/napi-v6/linux/"
cp -r node_modules/onnxruntime-common "$stage/core/node_modules/"

echo "the Vulkan loader (libvulkan1, libglvnd0: .deb files, unpacked by run.sh where the machine has none) ..."
for p in libvulkan1 libglvnd0; do
  cached=$(ls /var/cache/apt/archives/${p}_*_amd64.deb 2>/dev/null | head -1 || true)
  if [ -n "$cached" ]; then cp "$cached" "$stage/core/deb/"; else (cd "$stage/core/deb" && apt-get download "$p:amd64"); fi
done
XZ_OPT='-9e -T1' tar -cJf "$carry/core.tar.xz" -C "$stage/core" .

if [[ " $* " != *" --no-llama "* ]]; then
  nlc=bench/llama-cpp/node_modules
  if [ ! -d "$nlc/@node-llama-cpp/linux-x64-vulkan" ]; then
    echo "no $nlc/@node-llama-cpp/linux-x64-vulkan: run 'npm ci --prefix bench/llama-cpp' first; llama.cpp not packed"
  else
    echo "node-llama-cpp with its Vulkan build ..."
    mkdir -p "$stage/llama"
    # everything but the other platforms' builds, llama.cpp's sources (gitRelease.bundle) and source maps
    tar -C bench/llama-cpp -cf - --exclude='node_modules/@node-llama-cpp/linux-x64' --exclude='node_modules/@node-llama-cpp/linux-x64-cuda*' \
      --exclude='node_modules/@node-llama-cpp/linux-arm*' --exclude='gitRelease.bundle' --exclude='*.map' node_modules | tar -C "$stage/llama" -xf -
    # of the CPU builds llama.cpp picks from, the baseline and AVX2 ones
    find "$stage/llama/node_modules/@node-llama-cpp/linux-x64-vulkan/bins" -name 'libggml-cpu-*.so' ! -name 'libggml-cpu-x64.so' ! -name 'libggml-cpu-haswell.so' -delete
    XZ_OPT='-9e -T1' tar -cJf "$carry/llama.tar.xz" -C "$stage/llama" .
  fi
fi

tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 stat -c %s 2>/dev/null | awk '{s+=$1} END {print s}')
mib() { awk -v b="$1" 'BEGIN { printf "%.1f MiB", b / 1048576 }'; }
core=$(stat -c %s "$carry/core.tar.xz")
llama=$( [ -f "$carry/llama.tar.xz" ] && stat -c %s "$carry/llama.tar.xz" || echo 0)
echo "working tree $(mib "$tree"), core.tar.xz $(mib "$core"), llama.tar.xz $(mib "$llama"); the device tool's limit: 64 MiB"
if [ $((tree + core + llama)) -le $((64 * 1048576)) ]; then
  echo "fits: carry [\"$carry\"]"
elif [ $((tree + core)) -le $((64 * 1048576)) ]; then
  echo "core and llama do not fit together: two calls (bench/gpu/README.md): carry [\"$carry/core.tar.xz\"], then [\"$carry/llama.tar.xz\"] with --only llama"
else
  echo "even core does not fit beside the working tree"
fi
