#!/usr/bin/env bash
# The official `openai` npm library (tests/serve/openai_client/, installed by
# scripts/install-deps.sh with `npm ci`) against a real `lockstep serve` of a
# tiny model: plain completions, chat and models.list, completions with
# logprobs 5 and chat with top_logprobs 3, streaming and not. Skips (exit 77)
# only when node is absent; a missing node_modules is a failure.
set -euo pipefail
BIN=$1
SRC=$2
CLIENT=$SRC/tests/serve/openai_client
if ! command -v node >/dev/null; then
  echo "SKIP: node not found (apt-get install nodejs npm, then scripts/install-deps.sh)"
  exit 77
fi
if [ ! -d "$CLIENT/node_modules/openai" ]; then
  echo "FAIL: $CLIENT/node_modules/openai is missing: run scripts/install-deps.sh (npm ci in $CLIENT)" >&2
  exit 1
fi
T=$(mktemp -d)
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$T"
}
trap cleanup EXIT

cat > "$T/tiny.toml" <<'TOML'
[model]
architecture = "Qwen3MoeForCausalLM"
vocab_size = 300
hidden_size = 64
num_layers = 2
num_heads = 4
num_kv_heads = 2
head_dim = 16
intermediate_size = 128
qk_norm = true
max_position_embeddings = 256
num_experts = 4
num_experts_per_tok = 2
moe_intermediate_size = 64
init_std = 0.5
TOML
"$BIN" init --config "$T/tiny.toml" --out "$T/model" --seed 1 > /dev/null

KEY=openai-client-key
"$BIN" serve --model "$T/model" --port 0 --threads 1 --api-key "$KEY" --served-model-name tiny-moe \
  > "$T/serve.out" 2> "$T/serve.err" &
SERVER_PID=$!
# The first stdout line names the port.
for _ in $(seq 1 300); do
  if grep -q "listening on http://" "$T/serve.out"; then break; fi
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then
    echo "FAIL: lockstep serve exited:" >&2
    cat "$T/serve.err" >&2
    exit 1
  fi
  sleep 0.1
done
URL=$(grep -o "http://[0-9.]*:[0-9]*" "$T/serve.out" | head -1)
[ -n "$URL" ] || { echo "FAIL: no listening line from lockstep serve" >&2; cat "$T/serve.err" >&2; exit 1; }

if ! node "$CLIENT/client_test.mjs" "$URL" "$KEY" tiny-moe; then
  echo "--- lockstep serve stderr:" >&2
  cat "$T/serve.err" >&2
  exit 1
fi
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
SERVER_PID=""
echo "openai_client: ok"
