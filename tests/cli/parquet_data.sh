#!/usr/bin/env bash
# `lockstep data` on parquet files from two independent writers, hyparquet-writer
# and parquetjs (tests/data/parquet_writers/, installed by scripts/install-deps.sh
# with `npm ci`): flat columns of each type with nulls, a verl-style nested
# schema, a MAP, dictionary and plain encodings, data pages v1 and v2, several
# row groups and pages, UNCOMPRESSED / SNAPPY / GZIP / ZSTD. Each file's rows
# must equal, value for value and type for type, the JSONL the writer script
# wrote beside it. Also: --rows, JSONL input, an unsupported encoding,
# `generate` on a parquet prompt file (the same samples as from the JSONL), and
# truncated or corrupted files (exit 2 with the file named, never a crash).
# Skips (exit 77) without node or without the installed packages.
set -euo pipefail
BIN=$1
SRC=$2
WRITERS=$SRC/tests/data/parquet_writers
if ! command -v node >/dev/null; then
  echo "SKIP: node not found (apt-get install nodejs npm, then scripts/install-deps.sh)"
  exit 77
fi
if [ ! -d "$WRITERS/node_modules/hyparquet-writer" ] || [ ! -d "$WRITERS/node_modules/parquetjs" ]; then
  echo "SKIP: $WRITERS/node_modules is missing: run scripts/install-deps.sh (npm ci in $WRITERS)"
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

node "$WRITERS/write_files.mjs" "$T/files"

# Strict equality: ints stay ints, floats floats (Python's json keeps the kind).
cat > "$T/same.py" <<'PY'
import json, sys
def same(a, b):
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
got = [json.loads(l) for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])]
if len(got) != len(want):
    sys.exit(f"{sys.argv[1]}: {len(got)} rows, expected {len(want)}")
for i, (g, w) in enumerate(zip(got, want)):
    if not same(g, w):
        sys.exit(f"{sys.argv[1]}: row {i + 1} differs:\n  got  {json.dumps(g)}\n  want {json.dumps(w)}")
PY

n=0
for f in "$T"/files/*.parquet; do
  base=${f%.parquet}
  if [ -f "$base.error" ]; then
    if "$BIN" data "$f" > "$T/out.jsonl" 2> "$T/err.txt"; then
      echo "FAIL: $f should be refused" >&2; exit 1
    fi
    grep -qF "$(cat "$base.error")" "$T/err.txt" || { echo "FAIL: $f: got: $(cat "$T/err.txt")" >&2; exit 1; }
    grep -qF "$f" "$T/err.txt" || { echo "FAIL: the error does not name $f" >&2; exit 1; }
    continue
  fi
  "$BIN" data "$f" > "$T/out.jsonl"
  python3 "$T/same.py" "$T/out.jsonl" "$base.jsonl"
  n=$((n + 1))
done
echo "rows match for $n parquet files"
ls "$T"/files/*_zstd.parquet > /dev/null 2>&1 || echo "note: no ZSTD files (no zstd program and node < 22.15)"

# --rows N prints the first N rows; JSONL input prints its objects.
"$BIN" data "$T/files/hyparquet_verl_snappy.parquet" --rows 3 > "$T/three.jsonl"
head -3 "$T/files/hyparquet_verl_snappy.jsonl" > "$T/three_want.jsonl"
python3 "$T/same.py" "$T/three.jsonl" "$T/three_want.jsonl"
[ "$("$BIN" data "$T/files/hyparquet_verl_snappy.parquet" --rows 0 | wc -l)" -eq 0 ]
"$BIN" data "$T/files/parquetjs_v2_gzip.jsonl" > "$T/from_jsonl.jsonl"
python3 "$T/same.py" "$T/from_jsonl.jsonl" "$T/files/parquetjs_v2_gzip.jsonl"
"$BIN" data --help | grep -q "usage: lockstep data FILE"

# A command reading a prompt file: `generate` samples the same from the
# parquet file as from the JSONL holding the same rows.
cat > "$T/model.toml" <<'TOML'
[model]
vocab_size = 300
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 16
intermediate_size = 128
max_position_embeddings = 256
init_std = 0.2
TOML
"$BIN" init --config "$T/model.toml" --out "$T/m" --seed 5 > /dev/null
for ext in parquet jsonl; do
  "$BIN" generate --model "$T/m" --input "$T/files/hyparquet_chat.$ext" --output "$T/gen_$ext.jsonl" \
    --n 2 --max-new-tokens 6 --seed 9 --threads 1 2> /dev/null
done
[ "$(wc -l < "$T/gen_parquet.jsonl")" -eq 6 ] || { echo "FAIL: generate wrote $(wc -l < "$T/gen_parquet.jsonl") samples" >&2; exit 1; }
cmp "$T/gen_parquet.jsonl" "$T/gen_jsonl.jsonl" || { echo "FAIL: generate differs between parquet and JSONL input" >&2; exit 1; }

# Truncated and corrupted files: exit 2 with an error naming the file, or (for
# a flip that leaves the file readable) exit 0; any other exit is a crash.
src_file="$T/files/hyparquet_verl_gzip.parquet"
size=$(stat -c %s "$src_file")
bad="$T/bad.parquet"
for cut in 0 3 8 100 $((size / 2)) $((size - 9)) $((size - 1)); do
  head -c "$cut" "$src_file" > "$bad"
  rc=0; "$BIN" data "$bad" > /dev/null 2> "$T/err.txt" || rc=$?
  [ "$rc" -eq 2 ] || { echo "FAIL: truncated to $cut bytes: exit $rc" >&2; cat "$T/err.txt" >&2; exit 1; }
  grep -qF "$bad" "$T/err.txt" || { echo "FAIL: truncated to $cut: $(cat "$T/err.txt")" >&2; exit 1; }
done
refused=0
for i in $(seq 0 41); do
  pos=$(( (i * 7919) % size ))
  cp "$src_file" "$bad"
  printf '\xa5' | dd of="$bad" bs=1 seek="$pos" conv=notrunc status=none
  rc=0; "$BIN" data "$bad" > /dev/null 2> "$T/err.txt" || rc=$?
  case $rc in
    0) ;;
    2) grep -qF "$bad" "$T/err.txt" || { echo "FAIL: byte $pos: $(cat "$T/err.txt")" >&2; exit 1; }
       refused=$((refused + 1)) ;;
    *) echo "FAIL: byte $pos corrupted: exit $rc" >&2; cat "$T/err.txt" >&2; exit 1 ;;
  esac
done
echo "corrupted copies: $refused of 42 refused with an error, the rest read"
echo "OK"
