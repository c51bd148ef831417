#!/usr/bin/env bash
# Fetches and builds the llama.cpp that scripts/llamacpp/compare.sh measures
# lockstep against: a CPU-only Release build of the llama.cpp source that the
# npm package node-llama-cpp@3.21.1 carries as a git bundle (npm is the one
# registry this project's machines reach; GitHub is not needed). Nothing is
# written into the repository: everything goes under the cache folder.
#
#   scripts/llamacpp/setup.sh
#
# Settings (environment):
#   LLAMACPP_CACHE  the cache folder (default ~/.cache/lockstep-llamacpp)
#   JOBS            parallel build jobs (default 2)
#   LLAMACPP_NATIVE GGML_NATIVE (default ON: -march=native, AVX-512 where the CPU has it)
#   LLAMACPP_CMAKE_ARGS more configure arguments
#
# Layout of the cache folder:
#   npm/        node-llama-cpp@3.21.1 (npm install --ignore-scripts --omit=optional:
#               no install script runs, no prebuilt binary is fetched)
#   llama.cpp/  clone of npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
#   build/      CMake build (static libraries): bin/llama-batched-bench
#   bin/        logprobs (scripts/llamacpp/logprobs.cpp, linked against that build)
#   VERSION     the llama.cpp version line this script prints
#
# Idempotent: each step is skipped when its result is there (the build step is
# ninja/make, which rebuilds only what changed). Delete the cache folder to start over.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${LLAMACPP_CACHE:-$HOME/.cache/lockstep-llamacpp}
JOBS=${JOBS:-2}
NATIVE=${LLAMACPP_NATIVE:-ON}
PKG=node-llama-cpp@3.21.1
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd)

need() { command -v "$1" >/dev/null || { echo "setup.sh: $1 is missing (apt-get install $2)" >&2; exit 2; }; }
need npm npm
need git git
need cmake cmake
need g++ g++

# 1. The npm package (pinned).
BUNDLE=$CACHE/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [[ ! -f $BUNDLE ]]; then
  echo "== npm install $PKG -> $CACHE/npm"
  mkdir -p "$CACHE/npm"
  [[ -f $CACHE/npm/package.json ]] || echo '{"name":"lockstep-llamacpp","private":true}' >"$CACHE/npm/package.json"
  npm install --prefix "$CACHE/npm" --save-exact --ignore-scripts --omit=optional --no-audit --no-fund "$PKG"
fi
INSTALLED=$(node -p "require('$CACHE/npm/node_modules/node-llama-cpp/package.json').version" 2>/dev/null || echo '?')
[[ $INSTALLED == 3.21.1 ]] || { echo "setup.sh: $CACHE/npm holds node-llama-cpp $INSTALLED, not 3.21.1; delete $CACHE/npm" >&2; exit 2; }

# 2. The llama.cpp source, cloned from the bundle (as node-llama-cpp does).
SRC=$CACHE/llama.cpp
if [[ ! -f $SRC/CMakeLists.txt ]]; then
  echo "== git clone $BUNDLE -> $SRC"
  rm -rf "$SRC"
  git -c advice.detachedHead=false clone --quiet "$BUNDLE" "$SRC"
  git -C "$SRC" remote remove origin || true
fi

# 3. CPU-only build: no GPU backend, no HTTPS/CURL, static libraries, only the
#    targets needed. GGML_OPENMP stays on (llama.cpp's default CPU threading).
BUILD=$CACHE/build
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
if [[ ! -f $BUILD/CMakeCache.txt ]]; then
  echo "== cmake configure -> $BUILD"
  # shellcheck disable=SC2086
  cmake -S "$SRC" -B "$BUILD" "${GEN[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE="$NATIVE" \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=OFF -DGGML_HIP=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_SYCL=OFF \
    -DGGML_OPENCL=OFF -DGGML_RPC=OFF -DGGML_BLAS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    ${LLAMACPP_CMAKE_ARGS:-}
fi
echo "== build llama-batched-bench (-j$JOBS)"
cmake --build "$BUILD" --target llama-batched-bench -j "$JOBS"

# 4. logprobs: the correctness probe (per-position log-softmax through llama.h).
mkdir -p "$CACHE/bin"
LIBS=("$BUILD/src/libllama.a" "$BUILD/ggml/src/libggml.a" "$BUILD/ggml/src/libggml-cpu.a" "$BUILD/ggml/src/libggml-base.a")
for l in "${LIBS[@]}"; do [[ -f $l ]] || { echo "setup.sh: $l was not built" >&2; exit 1; }; done
if [[ ! -x $CACHE/bin/logprobs || $HERE/logprobs.cpp -nt $CACHE/bin/logprobs || $BUILD/src/libllama.a -nt $CACHE/bin/logprobs ]]; then
  echo "== g++ logprobs.cpp -> $CACHE/bin/logprobs"
  OMP=()
  grep -q '^GGML_OPENMP:BOOL=ON' "$BUILD/CMakeCache.txt" && OMP=(-fopenmp)
  g++ -O2 -std=c++17 -I"$SRC/include" -I"$SRC/ggml/include" "$HERE/logprobs.cpp" \
    -Wl,--start-group "${LIBS[@]}" -Wl,--end-group "${OMP[@]}" -lpthread -ldl -lm -o "$CACHE/bin/logprobs"
fi

# 5. Version.
COMMIT=$(git -C "$SRC" rev-parse HEAD)
DATE=$(git -C "$SRC" log -1 --format=%cs)
TAG=$(node -p "require('$CACHE/npm/node_modules/node-llama-cpp/llama/llama.cpp.info.json').tag" 2>/dev/null || echo '?')
GGML=$(sed -n 's/^set(GGML_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\))/\2/p' "$SRC/ggml/CMakeLists.txt" | paste -sd.)
VERSION="llama.cpp $TAG (node-llama-cpp $INSTALLED bundle), commit $COMMIT ($DATE), ggml $GGML, GGML_NATIVE=$NATIVE"
echo "$VERSION" >"$CACHE/VERSION"
echo "$VERSION"
echo "batched-bench: $BUILD/bin/llama-batched-bench"
echo "logprobs:      $CACHE/bin/logprobs"
