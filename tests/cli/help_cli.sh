#!/usr/bin/env bash
# Every command's help: `lockstep CMD -h`, `lockstep CMD --help` and
# `lockstep help CMD` print the same text, that command's own usage, and exit
# 0; the texts state the defaults the commands use.
set -euo pipefail
BIN=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

"$BIN" --help > "$T/top.txt"
"$BIN" help > "$T/help.txt"
cmp "$T/top.txt" "$T/help.txt"
mapfile -t cmds < <(sed -n 's/^  \([a-z][a-z0-9-]*\)  .*/\1/p' "$T/top.txt")
[ "${#cmds[@]}" -ge 15 ] || { cat "$T/top.txt"; echo "only ${#cmds[@]} commands listed"; exit 1; }
for c in "${cmds[@]}"; do
  "$BIN" "$c" --help > "$T/long.txt" || { echo "$c --help: exit code $?"; exit 1; }
  "$BIN" "$c" -h > "$T/short.txt" || { echo "$c -h: exit code $?"; exit 1; }
  "$BIN" help "$c" > "$T/cmd.txt" || { echo "help $c: exit code $?"; exit 1; }
  grep -q "usage: lockstep $c\b" "$T/long.txt" || { cat "$T/long.txt"; echo "$c --help: not its usage"; exit 1; }
  cmp "$T/long.txt" "$T/short.txt" || { echo "$c -h differs from --help"; exit 1; }
  cmp "$T/long.txt" "$T/cmd.txt" || { echo "help $c differs from $c --help"; exit 1; }
done
rc=0
"$BIN" help no-such-command > /dev/null 2> "$T/err.txt" || rc=$?
[ "$rc" = 2 ] && grep -q "unknown command 'no-such-command'" "$T/err.txt" || { cat "$T/err.txt"; exit 1; }

# The defaults shown are the ones used.
"$BIN" check-alignment --help > "$T/ca.txt"
grep -q -- "--n N  *samples per prompt (default 8)" "$T/ca.txt" || { cat "$T/ca.txt"; exit 1; }
grep -q -- "--max-new-tokens N  *(default 64)" "$T/ca.txt" || { cat "$T/ca.txt"; exit 1; }
"$BIN" generate --help | grep -q -- "--n N  *samples per prompt (default 1)"
"$BIN" eval --help | grep -q -- "--reward TYPE .*python"
"$BIN" rl --help | grep -q -- "--threads N"
"$BIN" sft --help | grep -q -- "--threads N"
"$BIN" demo --help | grep -q -- "--force"
echo "help_cli: OK"
