#!/usr/bin/env bash
# `lockstep init` writes a byte-level tokenizer that covers the model's whole
# vocabulary: texts still encode to bytes, and every id the model can sample
# (here the last one of a 2,048-entry vocabulary) decodes to text.
set -euo pipefail
BIN=$1
SRC=$2
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --set model.vocab_size=2048 --out "$T/m" >/dev/null
python3 - "$T/m/tokenizer.json" <<'PY'
import json, sys
tok = json.load(open(sys.argv[1]))
ids = sorted(tok["model"]["vocab"].values())
assert ids == list(range(2048)), f"ids are not 0..2047: {len(ids)} entries"
assert [t["id"] for t in tok["added_tokens"]] == [256, 257, 258]
assert tok["model"]["merges"] == [], "the filler pieces must not come from merges"
PY
# Bytes in, bytes out: "hi there" is 8 byte tokens, as before the filler.
"$BIN" tokenize --tokenizer "$T/m" --text "hi there" 2>"$T/warn" | grep -q '^ids (8): \[104,105,32,116,104,101,114,101\]' ||
  { echo "FAIL: encoding changed"; "$BIN" tokenize --tokenizer "$T/m" --text "hi there"; exit 1; }
# The file loads without a warning (added tokens keep their listed ids).
[ ! -s "$T/warn" ] || { echo "FAIL: warnings loading the tokenizer:"; cat "$T/warn"; exit 1; }
# Id 259, the first filler piece, is two spaces; the last id, 2047, is piece
# 1788 of the pairs of printable ASCII in order: '2' (0x32) then 'n' (0x6E).
out=$("$BIN" tokenize --tokenizer "$T/m" --ids 259,2047)
[ "$out" = "  2n" ] || { echo "FAIL: ids 259, 2047 decode to '$out', not '  2n'"; exit 1; }
# A vocabulary of exactly the bytes and specials has no filler.
"$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --set model.vocab_size=259 --out "$T/m259" >/dev/null
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); assert len(t['model']['vocab']) == 259" "$T/m259/tokenizer.json"
# --tokenizer and --no-tokenizer together are refused.
if "$BIN" init --config "$SRC/configs/test/dense-tiny.toml" --out "$T/x" --tokenizer "$T/m" --no-tokenizer 2>"$T/err"; then
  echo "FAIL: --tokenizer with --no-tokenizer accepted"; exit 1
fi
grep -q "exclude each other" "$T/err" || { cat "$T/err"; exit 1; }
echo "init_tokenizer: OK"
