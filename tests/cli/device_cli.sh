#!/usr/bin/env bash
# The device runtimes built into the binary, on a machine without a GPU:
#  - `lockstep info` lists cuda / hip as "built, N found" when the build linked
#    that runtime (LOCKSTEP_TEST_DEVICES, set by tests/cli/CMakeLists.txt from
#    the lockstep target) and "not built" otherwise;
#  - with a runtime built in and no device found, `--device cuda|hip` on
#    generate and score stops with exit 2 and the no-device message naming the
#    driver's error, never "not available in this build", and writes nothing;
#  - without it, the message says the build lacks it (exit 2).
# Exit 77 (skipped) when the build has no CUDA runtime, after the checks of
# what it does have.
set -euo pipefail
BIN=$1
BUILT=",${LOCKSTEP_TEST_DEVICES:-},"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
  echo "FAIL: $*"
  exit 1
}

line=$("$BIN" info | grep '^devices:') || fail "lockstep info prints no devices line"
echo "$line"
for want in "cpu" "interpret"; do
  grep -q "[ ,]$want[ ,(]" <<<"$line" || fail "devices line lacks $want: $line"
done

printf '{"prompt_ids":[1,2,3],"response_ids":[4,5]}\n' >"$T/in.jsonl"
# try DEVICE COMMAND...: the command with --device DEVICE must fail with exit 2;
# prints its stderr.
try() {
  local dev=$1 out rc
  shift
  set +e
  out=$("$BIN" "$@" --device "$dev" 2>&1)
  rc=$?
  set -e
  [ "$rc" -eq 2 ] || fail "$* --device $dev: expected exit 2, got $rc: $out"
  [ ! -e "$T/out.jsonl" ] || fail "$* --device $dev wrote output"
  echo "$out"
}

for dev in cuda hip; do
  vendor=$(tr a-z A-Z <<<"$dev")
  if [[ "$BUILT" == *",$dev,"* ]]; then
    n=$(sed -nE "s/.*[ ,]$dev \\(built, ([0-9]+) found.*/\\1/p" <<<"$line")
    [ -n "$n" ] || fail "the build links the $dev runtime but info does not say 'built, N found': $line"
    if [ "$n" -gt 0 ]; then
      echo "$dev: $n devices found, the no-device checks do not apply"
      continue
    fi
    for cmd in "score --model $T/none --input $T/in.jsonl --output $T/out.jsonl" \
      "generate --model $T/none --input $T/in.jsonl --output $T/out.jsonl --max-new-tokens 2"; do
      # shellcheck disable=SC2086
      out=$(try "$dev" $cmd)
      grep -q -- "--device $dev: no $vendor device found (${dev}GetDeviceCount" <<<"$out" ||
        fail "${cmd%% *} --device $dev: no no-device message: $out"
      if grep -q "not available in this build" <<<"$out"; then
        fail "${cmd%% *} --device $dev says 'not available in this build' in a build that has it: $out"
      fi
    done
    echo "$dev: built, no device: clear message, exit 2"
  else
    grep -q "[ ,]$dev (not built)" <<<"$line" || fail "info does not say $dev is not built: $line"
    out=$(try "$dev" score --model "$T/none" --input "$T/in.jsonl" --output "$T/out.jsonl")
    grep -q "not available in this build" <<<"$out" || fail "--device $dev without the runtime: $out"
    echo "$dev: not built: clear message, exit 2"
  fi
done
[[ "$BUILT" == *",cuda,"* ]] || {
  echo "this build has no CUDA runtime: skipped"
  exit 77
}
echo "device CLI checks passed"
