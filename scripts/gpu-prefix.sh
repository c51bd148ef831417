#!/usr/bin/env bash
# Unpacks the .deb files of scripts/gpu-deps.sh into a prefix (dpkg -x, no
# install, no root needed) and writes PREFIX/lockstep-deps.cmake, an initial
# cache that makes CMake take every dependency from the prefix:
#
#   scripts/gpu-prefix.sh DEBDIR PREFIX
#   cmake -C PREFIX/lockstep-deps.cmake -DLOCKSTEP_MPI=OFF -S . -B build/gpu -G Ninja
#
# The packages were built for /usr, so the script also moves PREFIX/lib into
# PREFIX/usr/lib (usr-merge), re-points absolute symlinks into the prefix,
# rewrites the .pc files' /usr to PREFIX/usr, and puts a pkg-config wrapper
# in PREFIX/bin that sees the prefix's .pc files only.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 DEBDIR PREFIX" >&2
  exit 2
fi
DEBDIR=$1
PREFIX=$2
ls "$DEBDIR"/*.deb >/dev/null || { echo "gpu-prefix: no .deb files in $DEBDIR (run scripts/gpu-deps.sh)" >&2; exit 1; }
mkdir -p "$PREFIX"
P=$(cd "$PREFIX" && pwd)
ARCH_LIB=$P/usr/lib/x86_64-linux-gnu

# dpkg -x, or ar + tar on a machine without dpkg (GPU_PREFIX_NO_DPKG=1 tries that).
unpack() {
  if [ -z "${GPU_PREFIX_NO_DPKG:-}" ] && command -v dpkg-deb >/dev/null; then
    dpkg-deb -x "$1" "$P"
    return
  fi
  local member z
  member=$(ar t "$1" | grep '^data\.tar')
  case "$member" in *.xz) z=-J ;; *.zst) z=--zstd ;; *.gz) z=-z ;; *) z= ;; esac
  ar p "$1" "$member" | tar -x $z -C "$P"
}
for f in "$DEBDIR"/*.deb; do unpack "$f"; done

# usr-merge: zlib1g installs to /lib, the rest to /usr/lib.
if [ -d "$P/lib" ] && [ ! -L "$P/lib" ]; then
  mkdir -p "$P/usr/lib"
  cp -a "$P/lib/." "$P/usr/lib/"
  rm -rf "${P:?}/lib"
  ln -s usr/lib "$P/lib"
fi

# Absolute symlinks (libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) would
# point at the host's files, or at nothing.
find "$P/usr" -type l -lname '/*' | while read -r l; do
  t=$(readlink "$l")
  case "$t" in "$P"/*) continue ;; /lib/*) t=/usr$t ;; esac
  ln -sfn "$P$t" "$l"
done

# .pc files say prefix=/usr (and nlohmann_json.pc -I/usr/include).
PC_DIRS="$ARCH_LIB/pkgconfig:$P/usr/lib/pkgconfig:$P/usr/share/pkgconfig"
for d in ${PC_DIRS//:/ }; do
  [ -d "$d" ] || continue
  for pc in "$d"/*.pc; do
    [ -f "$pc" ] || continue
    sed -E -i -e "s#^([A-Za-z_]+)=/usr(/|\$)#\1=$P/usr\2#" -e "s#(-[IL])/usr/#\1$P/usr/#g" "$pc"
  done
done

# pkg-config: the prefix's pkgconf (the system's if the prefix has none),
# searching the prefix's .pc files only.
mkdir -p "$P/bin"
PKGCONF="$P/usr/bin/pkgconf"
[ -x "$PKGCONF" ] || PKGCONF=$(command -v pkgconf || command -v pkg-config || true)
[ -n "$PKGCONF" ] || { echo "gpu-prefix: no pkgconf in $DEBDIR nor on PATH" >&2; exit 1; }
cat >"$P/bin/pkg-config" <<EOF
#!/bin/sh
# Written by scripts/gpu-prefix.sh: pkg-config over $P only.
unset PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
export PKG_CONFIG_LIBDIR="$PC_DIRS"
export LD_LIBRARY_PATH="$ARCH_LIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$PKGCONF" "\$@"
EOF
chmod +x "$P/bin/pkg-config"

# Linked programs find the prefix's libraries at run time, also the ones
# those load in turn (cpp-httplib's libssl, libbrotli): DT_RPATH covers
# indirect dependencies, the newer DT_RUNPATH does not. LINKER: lets CMake
# spell the flags for whichever program links (g++ or nvcc).
cat >"$P/lockstep-deps-link.cmake" <<EOF
# Written by scripts/gpu-prefix.sh; included after project() (CMAKE_PROJECT_INCLUDE).
add_link_options("LINKER:--disable-new-dtags" "LINKER:-rpath,$ARCH_LIB")
EOF

{
  echo "# Written by scripts/gpu-prefix.sh: lockstep's dependencies from $P"
  echo "# (unpacked .debs). Use as: cmake -C $P/lockstep-deps.cmake ..."
  echo "set(CMAKE_PREFIX_PATH \"$P/usr\" CACHE STRING \"\")"
  echo "set(PKG_CONFIG_EXECUTABLE \"$P/bin/pkg-config\" CACHE FILEPATH \"\")"
  echo "set(CMAKE_PROJECT_INCLUDE \"$P/lockstep-deps-link.cmake\" CACHE FILEPATH \"\")"
  echo "# The multiarch headers (openssl/opensslconf.h): the compiler looks for them in"
  echo "# /usr/include/x86_64-linux-gnu only, and the .pc files do not name the directory."
  for lang in CXX CUDA; do
    echo "set(CMAKE_${lang}_STANDARD_INCLUDE_DIRECTORIES \"$P/usr/include/x86_64-linux-gnu\" CACHE STRING \"\")"
  done
  echo "# Each package's CMake config, pinned: the prefix's, whatever else is installed."
  for cfg in "$ARCH_LIB"/cmake/*/*[Cc]onfig.cmake "$P"/usr/share/cmake/*/*[Cc]onfig.cmake; do
    [ -f "$cfg" ] || continue
    name=$(basename "$cfg")
    case "$name" in *[Vv]ersion.cmake) continue ;; esac
    name=${name%Config.cmake}
    name=${name%-config.cmake}
    echo "set(${name}_DIR \"$(dirname "$cfg")\" CACHE PATH \"\")"
  done
} >"$P/lockstep-deps.cmake"

echo "gpu-prefix: $(find "$DEBDIR" -name '*.deb' | wc -l) packages unpacked into $P ($(du -sh "$P" | cut -f1))"
echo "gpu-prefix: configure with: cmake -C $P/lockstep-deps.cmake -DLOCKSTEP_MPI=OFF ..."
