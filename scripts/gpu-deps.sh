#!/usr/bin/env bash
# Downloads (apt-get download, no install) the .deb files of every Debian
# package a -DLOCKSTEP_MPI=OFF build of lockstep, its tests and benchmarks
# needs, for a machine that has a compiler, CMake and ninja but none of these
# and no package registry (the lent GPU machine, docs/gpu.md). Run it here;
# scripts/gpu-prefix.sh unpacks the result there.
#
#   scripts/gpu-deps.sh [DEBDIR]     (default third_party/debs, git-ignored)
#   GPU_DEPS_EXTRA="pkg ..."         more packages (e.g. the OpenBLAS baseline of
#                                    bench/: libopenblas-dev libopenblas0
#                                    libopenblas-pthread-dev libopenblas0-pthread libgfortran5)
#
# Writes DEBDIR/MANIFEST: one line per .deb (package, version, bytes, sha256)
# and the Depends it leaves out on purpose.
set -euo pipefail

cd "$(dirname "$0")/.." || exit
DEBDIR=${1:-third_party/debs}

# Each -dev package with the runtime libraries it needs that a bare machine
# may lack. Not downloaded: what the compiler brings (libc6, libc6-dev,
# libgcc-s1, libstdc++6, libstdc++-dev), googletest (gtest's sources), the
# PCRE2 16/32-bit and POSIX libraries, libboost-thread (Boost.Context alone
# is enough for kernels/gpu/interp), MPI (-DLOCKSTEP_MPI=OFF).
PACKAGES=(
  libhwy-dev libhwy1                                       # Highway (CPU kernels)
  libboost-context-dev libboost-context1.74-dev libboost-context1.74.0
  libboost1.74-dev                                         # Boost headers + CMake configs
  nlohmann-json3-dev                                       # JSON
  libtomlplusplus-dev libtomlplusplus3                     # TOML
  libcpp-httplib-dev libcpp-httplib0.11                    # HTTP server/client
  libssl-dev libssl3 zlib1g-dev zlib1g libbrotli-dev libbrotli1  # cpp-httplib's .pc Requires
  libpcre2-dev libpcre2-8-0                                # tokenizer split patterns
  libsnappy-dev libsnappy1v5 libzstd-dev libzstd1          # parquet page codecs (data/)
  libgtest-dev libgmock-dev                                # tests (static libraries)
  libbenchmark-dev libbenchmark1debian                     # bench/
  pkgconf-bin libpkgconf3                                  # pkg-config, for the .pc files above
)
# shellcheck disable=SC2206
PACKAGES+=(${GPU_DEPS_EXTRA:-})

# Depends of the packages above that are left out on purpose (see above).
SKIPPED_DEPS=(libc6 libc6-dev libc-dev libgcc-s1 libstdc++6 libstdc++-12-dev googletest
  libpcre2-16-0 libpcre2-32-0 libpcre2-posix3 libboost-thread1.74-dev)

mkdir -p "$DEBDIR"
DEBDIR=$(cd "$DEBDIR" && pwd)
rm -f "$DEBDIR"/*.deb "$DEBDIR"/MANIFEST

download() {
  # -o APT::Sandbox::User=root: the folder need not be writable by _apt.
  (cd "$DEBDIR" && apt-get download -q -o APT::Sandbox::User=root "${PACKAGES[@]}")
}
if ! download; then
  echo "gpu-deps: download failed; refreshing the package lists once" >&2
  apt-get update -qq
  download
fi

{
  echo "# lockstep GPU-machine dependencies: apt-get download on $(grep -h '^PRETTY_NAME=' /etc/os-release | cut -d= -f2 | tr -d '"'), $(date -u +%F)"
  echo "# package version bytes sha256"
  for f in "$DEBDIR"/*.deb; do
    echo "$(dpkg-deb -f "$f" Package) $(dpkg-deb -f "$f" Version) $(stat -c %s "$f") $(sha256sum "$f" | cut -d' ' -f1)"
  done
} >"$DEBDIR/MANIFEST"

# Every Depends of a downloaded package is either downloaded or skipped on purpose.
known=" $(for f in "$DEBDIR"/*.deb; do dpkg-deb -f "$f" Package; done | tr '\n' ' ') ${SKIPPED_DEPS[*]} "
missing=()
for f in "$DEBDIR"/*.deb; do
  deps=$({ dpkg-deb -f "$f" Depends; dpkg-deb -f "$f" Pre-Depends; } | tr ',' '\n' | sed 's/([^)]*)//g; s/|.*//; s/:any//; s/ //g' | grep -v '^$' || true)
  for d in $deps; do
    case "$known" in *" $d "*) ;; *) missing+=("$(dpkg-deb -f "$f" Package) -> $d") ;; esac
  done
done
echo "# Depends left out on purpose: ${SKIPPED_DEPS[*]}" >>"$DEBDIR/MANIFEST"
if [ ${#missing[@]} -gt 0 ]; then
  printf 'gpu-deps: not downloaded and not on the skip list: %s\n' "${missing[@]}" >&2
  exit 1
fi

n=$(find "$DEBDIR" -name '*.deb' | wc -l)
bytes=$(cat "$DEBDIR"/*.deb | wc -c)
echo "gpu-deps: $n packages, $((bytes / 1024)) KiB in $DEBDIR (manifest: $DEBDIR/MANIFEST)"
