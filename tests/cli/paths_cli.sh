#!/usr/bin/env bash
# The path rule of config files, from the command line:
#  1. paths in a config are its folder's (a config in a subfolder, run from
#     elsewhere), paths given with --set the current folder's;
#  2. the run's config.toml holds absolute paths, every default and floats at
#     their shortest, and `rl --resume` with it works from any folder;
#  3. a file that cannot be opened is named by its absolute path;
#  4. rl and sft take --threads; demo refuses a non-empty --out without --force.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
# has FILE KEY VALUE: FILE holds the line KEY = "VALUE" (either TOML quote).
has() { grep -qx "$2 = [\"']$3[\"']" "$1" || { cat "$1"; echo "no $2 = $3 in $1"; exit 1; }; }

"$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --set model.vocab_size=300 --out "$T/model" > /dev/null
mkdir -p "$T/cfg/sub/data" "$T/elsewhere" "$T/other"
for i in 1 2 3 4; do echo "{\"prompt\": \"$i+$i=\", \"label\": \"$((i + i))\"}"; done > "$T/cfg/sub/data/train.jsonl"
cat > "$T/cfg/sub/rl.toml" <<'TOML'
[model]
path = "../../model"
[data]
train_file = "data/train.jsonl"
apply_chat_template = false
[rollout]
batch_size = 2
n = 2
max_new_tokens = 4
kv_blocks = 64
[train]
steps = 2
save_interval = 1
lr = 3e-4
out_dir = "../../run"
[reward]
type = "math"
TOML

# 1. Run from another folder with a relative --config: the config's paths are its folder's.
cd "$T/elsewhere"
"$BIN" rl --config ../cfg/sub/rl.toml --threads 1 > rl.log 2>&1 || { cat rl.log; exit 1; }
grep -q "1 thread -> $T/run" rl.log || { cat rl.log; exit 1; }
test -s "$T/run/checkpoints/latest"

# 2. The saved config: absolute paths, every default, shortest floats.
C="$T/run/config.toml"
has "$C" path "$T/model"
has "$C" train_file "$T/cfg/sub/data/train.jsonl"
has "$C" out_dir "$T/run"
grep -qx "lr = 0.0003" "$C" || { cat "$C"; exit 1; }
grep -qx "beta2 = 0.95" "$C" || { cat "$C"; exit 1; }         # a default
grep -qx "eps_clip = 0.2" "$C" || { cat "$C"; exit 1; }       # [algo], absent from the file
grep -qx "extractors = \[.*\]" "$C" || { cat "$C"; exit 1; }  # [reward] in full
if grep -q "0000000\|9999999" "$C"; then cat "$C"; echo "a float not at its shortest"; exit 1; fi
cd "$T/other"
"$BIN" rl --config "$C" --resume --set train.steps=3 > resume.log 2>&1 || { cat resume.log; exit 1; }
grep -q '"step":3' "$T/run/metrics.jsonl" || { cat resume.log; exit 1; }

# 3. --set paths are the current folder's; a missing file is named in full.
rc=0
"$BIN" rl --config "$T/cfg/sub/rl.toml" --out new --set data.train_file=missing.jsonl 2> err.txt || rc=$?
[ "$rc" = 2 ] || { cat err.txt; echo "exit code $rc, expected 2"; exit 1; }
grep -q "$T/other/missing.jsonl: cannot open" err.txt || { cat err.txt; exit 1; }
cp "$T/cfg/sub/data/train.jsonl" mine.jsonl
"$BIN" rl --config "$T/cfg/sub/rl.toml" --out new --set data.train_file=mine.jsonl --set train.steps=1 \
  > set.log 2>&1 || { cat set.log; exit 1; }
has new/config.toml train_file "$T/other/mine.jsonl"
has new/config.toml out_dir "$T/other/new"
rc=0
"$BIN" rl --config "$T/cfg/sub/rl.toml" --threads -1 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q -- "--threads" err.txt || { cat err.txt; exit 1; }

# sft: the same rule and --threads.
cat > "$T/cfg/sub/sft.toml" <<'TOML'
[model]
path = "../../model"
[data]
train_file = "data/sft.jsonl"
apply_chat_template = false
[train]
steps = 1
batch_size = 2
out_dir = "../../sft"
TOML
for i in 1 2; do echo "{\"prompt\": \"$i+$i=\", \"response\": \"$((i + i))\"}"; done > "$T/cfg/sub/data/sft.jsonl"
"$BIN" sft --config ../cfg/sub/sft.toml --threads 1 > sft.log 2>&1 || { cat sft.log; exit 1; }
grep -q "1 thread -> $T/sft" sft.log || { cat sft.log; exit 1; }
has "$T/sft/config.toml" train_file "$T/cfg/sub/data/sft.jsonl"

# eval: the same rule for [model], [data] and [eval]'s output files.
cat > "$T/cfg/sub/eval.toml" <<'TOML'
[model]
path = "../../model"
[data]
eval_file = "data/train.jsonl"
apply_chat_template = false
[eval]
n = 2
max_new_tokens = 4
output = "out/problems.jsonl"
TOML
"$BIN" eval --config ../cfg/sub/eval.toml --threads 1 --summary sum.json > eval.log 2>&1 || { cat eval.log; exit 1; }
test -s "$T/cfg/sub/out/problems.jsonl"
test -s "$T/other/sum.json"  # a flag: the current folder's

# 4. demo --out: a non-empty directory is refused (and left alone) unless --force.
mkdir -p "$T/d" && echo keep > "$T/d/notes.txt"
rc=0
"$BIN" demo --out "$T/d" --sft-steps 1 --rl-steps 0 2> err.txt || rc=$?
[ "$rc" = 2 ] && grep -q "$T/d: --out is not empty" err.txt || { cat err.txt; echo "exit code $rc"; exit 1; }
grep -qx keep "$T/d/notes.txt"
echo "paths_cli: OK"
