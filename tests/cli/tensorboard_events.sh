#!/usr/bin/env bash
# TensorBoard event files read independently of lockstep: a short demo with
# [log] tensorboard = true and metric_names = "verl", then `lockstep rl
# --resume` for one more step. Python reads every events file with classes
# that Debian's protoc generates from tests/metrics/event.proto and
# summary.proto (TensorBoard's field numbers), checks each TFRecord's length
# and payload CRC32C (computed here, bit by bit), and compares tags, steps,
# values and wall times with metrics.jsonl. Also: the resumed run's file
# starts with a SessionLog START at the step it resumes from, and the report
# of the verl-named run still charts it. Skips (exit 77) without protoc or
# python3-protobuf.
set -euo pipefail
BIN=$1
SRC=$2
command -v protoc >/dev/null || { echo "SKIP: protoc not found (apt-get install protobuf-compiler)"; exit 77; }
# Debian's python3-protobuf is installed for /usr/bin/python3, which may not be
# the python3 first on PATH.
PY=""
for p in /usr/bin/python3 python3; do
  if "$p" -c "import google.protobuf" 2>/dev/null; then PY=$p; break; fi
done
[ -n "$PY" ] || { echo "SKIP: python3-protobuf not installed (apt-get install python3-protobuf)"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

mkdir -p "$T/pb"
protoc -I "$SRC/tests/metrics" --python_out="$T/pb" "$SRC/tests/metrics/event.proto" "$SRC/tests/metrics/summary.proto"

run="$T/run"
"$BIN" demo --out "$run" --sft-steps 10 --rl-steps 2 --threads 2 --set eval.interval=2 --set rollout.batch_size=4 \
  --set eval.n=2 --set log.tensorboard=true --set 'log.metric_names="verl"' > "$T/demo.log" 2>&1 \
  || { cat "$T/demo.log"; exit 1; }
"$BIN" rl --config "$run/config.toml" --resume --set train.steps=3 > "$T/resume.log" 2>&1 \
  || { cat "$T/resume.log"; exit 1; }
"$BIN" report "$run" > "$T/report.log" 2>&1 || { cat "$T/report.log"; exit 1; }

"$PY" - "$T/pb" "$run" <<'PY'
import glob, json, math, os, re, struct, sys
sys.path.insert(0, sys.argv[1])
import event_pb2
run = sys.argv[2]

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

assert crc32c(b"123456789") == 0xE3069283

def events(path):
    data = open(path, "rb").read()
    at, out = 0, []
    while at < len(data):
        assert len(data) - at >= 16, f"{path}: torn record at byte {at}"
        n, = struct.unpack_from("<Q", data, at)
        crc_len, = struct.unpack_from("<I", data, at + 8)
        assert crc_len == masked(data[at:at + 8]), f"{path}: bad length CRC at byte {at}"
        payload = data[at + 12:at + 12 + n]
        crc_data, = struct.unpack_from("<I", data, at + 12 + n)
        assert crc_data == masked(payload), f"{path}: bad payload CRC at byte {at}"
        e = event_pb2.Event()
        e.ParseFromString(payload)
        out.append(e)
        at += 16 + n
    return out

files = sorted(glob.glob(f"{run}/tensorboard/events.out.tfevents.*"))
assert len(files) == 2, files  # the demo's run and the resumed one
scalars = {}  # step -> (wall_time, {tag: value}); a later file's step replaces an earlier one's
restarts = []
for path in files:
    evs = events(path)
    assert evs[0].file_version == "brain.Event:2", (path, evs[0])
    for e in evs[1:]:
        kind = e.WhichOneof("what")
        if kind == "session_log":
            assert e.session_log.status == event_pb2.SessionLog.START, e
            restarts.append((os.path.basename(path), e.step))
        else:
            assert kind == "summary", e
            scalars[e.step] = (e.wall_time, {v.tag: v.simple_value for v in e.summary.value})
assert restarts == [(os.path.basename(files[1]), 3)], restarts

rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
assert [r["step"] for r in rows] == [0, 1, 2, 3], [r["step"] for r in rows]
assert sorted(scalars) == [0, 1, 2, 3], sorted(scalars)
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
compared = 0
for r in rows:
    wall, tb = scalars[r["step"]]
    assert wall == r["time"], (r["step"], wall, r["time"])
    want = {k: v for k, v in r.items() if k not in ("step", "time") and isinstance(v, (int, float, type(None)))}
    assert set(tb) == set(want), (r["step"], set(tb) ^ set(want))
    for k, v in want.items():
        if v is None:
            assert math.isnan(tb[k]), (r["step"], k, tb[k])
        else:
            assert tb[k] == f32(float(v)), (r["step"], k, tb[k], v)
        compared += 1
# verl's names where they exist, lockstep's elsewhere.
for r in rows[1:]:
    for k in ("actor/pg_loss", "actor/grad_norm", "critic/score/mean", "critic/rewards/mean",
              "response_length/mean", "response_length/clip_ratio", "timing_s/gen", "timing_s/step",
              "rollout/accuracy"):
        assert k in r, (r["step"], k)
    for k in ("train/pg_loss", "rollout/reward_mean", "perf/step_time_s"):
        assert k not in r, (r["step"], k)
# The report maps verl's names back: its reward and loss charts have data.
html = open(f"{run}/report.html", encoding="utf-8").read()
for chart in ("reward", "loss", "accuracy", "step_time"):
    m = re.search(r'<svg[^>]*class="([^"]*)"[^>]*data-chart="%s"' % chart, html)
    assert m and "nodata" not in m.group(1), (chart, m and m.group(1))
print(f"{len(files)} events files, {len(scalars)} steps, {compared} scalars equal to metrics.jsonl; "
      f"restart marker at step {restarts[0][1]}")
PY
echo "tensorboard_events: OK"
