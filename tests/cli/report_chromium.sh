#!/usr/bin/env bash
# `lockstep report` rendered by a real browser: a synthetic run directory (a
# torn last metrics line, NaN values, eval steps, samples with HTML special
# characters, an SFT warm-up, summary.json) -> report.html -> headless
# Chromium, which (a) runs the page's self-check script: every chart with data
# must have as many drawn series (non-empty SVG bounding boxes) as it declares,
# exactly the expected chart is a "no data" panel, and no JS error is logged;
# (b) takes a screenshot whose pixels must show the charts (coloured lines and
# areas, not a blank page). Skips (exit 77) without /usr/bin/chromium.
# LOCKSTEP_REPORT_KEEP=DIR keeps the run dir, the HTML and the screenshot.
set -euo pipefail
BIN=$1
CHROMIUM=${LOCKSTEP_CHROMIUM:-/usr/bin/chromium}
if [ ! -x "$CHROMIUM" ]; then
  echo "SKIP: $CHROMIUM not found (apt-get install chromium, or scripts/install-deps.sh)"
  exit 77
fi
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT

python3 - "$T/run" <<'PY'
import json, math, os, random, sys
run = sys.argv[1]
os.makedirs(f"{run}/samples")
os.makedirs(f"{run}/sft")
random.seed(7)
with open(f"{run}/config.toml", "w") as f:
    f.write('[model]\npath = "runs/sft <final>"\n[algo]\nname = "grpo"\n[log]\nreport_interval = 10\n')
lines = []
for s in range(0, 41):
    m = {"step": s}
    if s > 0:
        r = 0.15 + 0.6 * (1 - math.exp(-s / 15)) + random.uniform(-0.04, 0.04)
        m.update({
            "rollout/reward_mean": r, "rollout/reward_std": 0.3 - 0.002 * s,
            "rollout/response_len_mean": 60 - 0.5 * s + random.uniform(-3, 3),
            "rollout/response_len_max": 128 if s < 20 else 96,
            "rollout/truncated_ratio": max(0.0, 0.25 - 0.006 * s),
            "train/train_rollout_logprob_abs_diff": 0.0, "train/train_rollout_logprob_abs_diff_max": 0.0,
            "train/train_rollout_kl": 0.0, "train/kl": 0.0004 * s,
            "train/pg_loss": random.uniform(-0.05, 0.05), "train/entropy": 1.8 - 0.02 * s,
            "train/grad_norm": None if s == 17 else 0.8 + random.uniform(0, 0.6), "train/lr": 1e-6,
            "perf/rollout_time_s": 2.0 + random.uniform(0, 0.3), "perf/reward_time_s": 0.05,
            "perf/train_time_s": 1.1 + random.uniform(0, 0.1), "perf/weight_sync_s": 0.02,
            "perf/rollout_tokens_per_s": 1800 + random.uniform(-100, 100),
            "perf/train_tokens_per_s": 3100 + random.uniform(-100, 100)})
        m["perf/step_time_s"] = sum(m[k] for k in ("perf/rollout_time_s", "perf/reward_time_s",
                                                  "perf/train_time_s", "perf/weight_sync_s"))
    if s % 10 == 0:
        for name, base in (("test", 0.2), ("hard", 0.05)):
            p1 = base + 0.01 * s
            m.update({f"eval/{name}/pass@1": p1, f"eval/{name}/pass@4": min(1, 2.2 * p1),
                      f"eval/{name}/pass@8": min(1, 2.8 * p1), f"eval/{name}/truncated_ratio": 0.2 - 0.004 * s,
                      f"eval/{name}/response_len_mean": 70 - 0.6 * s})
        if s > 0:
            m["perf/eval_time_s"] = 0.9
            m["perf/step_time_s"] += 0.9
    lines.append(json.dumps(m))
with open(f"{run}/metrics.jsonl", "w") as f:
    f.write("\n".join(lines) + '\n{"step": 41, "rollout/rew')  # torn: the run is writing it
for step in (1, 40):
    with open(f"{run}/samples/step_{step:06d}.jsonl", "w") as f:
        for i in range(6):
            f.write(json.dumps({"step": step, "prompt": f"What is {i} + {step}? <b>&amp;</b> 'quote' \"dq\"",
                                "response": f"<script>alert({i})</script> the answer is {i + step}",
                                "reward": i % 2, "finish_reason": "length" if i == 5 else "stop",
                                "response_len": 12 + i, "advantage": 0.5 if i % 2 else -0.5}) + "\n")
with open(f"{run}/sft/metrics.jsonl", "w") as f:
    for s in range(1, 21):
        f.write(json.dumps({"step": s, "train/loss": 3.0 * math.exp(-s / 8) + 0.4}) + "\n")
with open(f"{run}/summary.json", "w") as f:
    json.dump({"steps": 40, "eval": {"test": {"pass@1": 0.6}}}, f)
PY

"$BIN" report "$T/run" --out "$T/report.html" > "$T/report.out" 2> "$T/report.err"
grep -q "malformed line skipped" "$T/report.err" || { echo "no torn-line warning on stderr:"; cat "$T/report.err"; exit 1; }
grep -q "14 charts" "$T/report.out" || { echo "unexpected summary:"; cat "$T/report.out"; exit 1; }

FLAGS=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --no-default-browser-check
       --disable-extensions --disable-background-networking --disable-sync --hide-scrollbars --mute-audio
       --window-size=1280,3600 --virtual-time-budget=10000 --enable-logging=stderr --v=0)
URL="file://$T/report.html"
# (a) The DOM after the page's self-check script ran.
timeout 90 "$CHROMIUM" "${FLAGS[@]}" --user-data-dir="$T/profile-dom" --dump-dom "$URL" > "$T/dom.html" 2> "$T/dom.log" || {
  echo "chromium --dump-dom failed:"; tail -20 "$T/dom.log"; exit 1; }
# (b) A screenshot of the same layout (1280 CSS px wide, tall enough for every
# chart), at half scale: a quarter of the pixels to decode in pure Python.
timeout 90 "$CHROMIUM" "${FLAGS[@]}" --user-data-dir="$T/profile-shot" --force-device-scale-factor=0.5 \
  --screenshot="$T/shot.png" "$URL" > /dev/null 2> "$T/shot.log" || {
  echo "chromium --screenshot failed:"; tail -20 "$T/shot.log"; exit 1; }
if [ -n "${LOCKSTEP_REPORT_KEEP:-}" ]; then
  mkdir -p "$LOCKSTEP_REPORT_KEEP"
  cp -r "$T/run" "$T/report.html" "$T/shot.png" "$T/dom.html" "$LOCKSTEP_REPORT_KEEP/"
fi

# No JavaScript error in either run (console errors are logged as CONSOLE lines).
if grep -E "Uncaught|CONSOLE.*(Error|error)" "$T/dom.log" "$T/shot.log"; then
  echo "JavaScript errors while rendering the report"; exit 1
fi

python3 - "$T/dom.html" "$T/shot.png" <<'PY'
import html, json, re, struct, sys, zlib
dom = open(sys.argv[1], encoding="utf-8").read()
m = re.search(r'<pre id="render-check"[^>]*data-done="1"[^>]*>(.*?)</pre>', dom, re.S)
assert m, "the page's self-check did not run (no data-done on #render-check)"
charts = json.loads(html.unescape(m.group(1)))
ids = [c["id"] for c in charts]
expected_ids = ["reward", "eval_pass", "truncation", "response_len", "logprob_gap", "kl", "clipfrac",
                "entropy", "grad_norm", "loss", "lr", "step_time", "throughput", "sft_loss"]
assert ids == expected_ids, ids
for c in charts:
    assert c["width"] > 300 and c["height"] > 150, c  # laid out at a readable size
    if c["id"] == "clipfrac":  # train/tis_clipfrac and train/pg_clipfrac are absent
        assert c["nodata"] and c["expected"] == 0, c
        continue
    assert not c["nodata"], c
    assert c["expected"] > 0 and c["drawn"] == c["expected"], f"series not drawn: {c}"
want = {"reward": 2, "eval_pass": 6, "truncation": 3, "response_len": 4, "kl": 2, "step_time": 6,
        "throughput": 2, "sft_loss": 1}
for c in charts:
    if c["id"] in want:
        assert c["expected"] == want[c["id"]], (c, want[c["id"]])
# The escaped sample text arrived as text, not markup; the warning is in the page.
assert "&lt;script&gt;alert(0)&lt;/script&gt;" in dom, "sample text not escaped"
assert "<script>alert(" not in dom
assert "malformed line skipped" in dom

# Screenshot: decode the PNG (8-bit RGB/RGBA, not interlaced).
data = open(sys.argv[2], "rb").read()
assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
pos, idat = 8, b""
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        w, h, depth, ctype, _, _, interlace = struct.unpack(">IIBBBBB", body)
        assert depth == 8 and ctype in (2, 6) and interlace == 0, (depth, ctype, interlace)
        bpp = 3 if ctype == 2 else 4
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytes(stride)
rows = []  # (h, w) rows of (r, g, b)
for y in range(h):
    f = raw[y * (stride + 1)]
    line = raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)]
    if f == 0:
        cur = bytearray(line)
    elif f == 2:
        cur = bytearray(map(lambda a, b: (a + b) & 255, line, prev))
    else:
        cur = bytearray(line)
        for i in range(stride):
            a = cur[i - bpp] if i >= bpp else 0
            if f == 1:
                cur[i] = (cur[i] + a) & 255
            elif f == 3:
                cur[i] = (cur[i] + ((a + prev[i]) >> 1)) & 255
            else:  # Paeth
                b = prev[i]
                c = prev[i - bpp] if i >= bpp else 0
                pa, pb = abs(b - c), abs(a - c)
                pc = abs(a + b - 2 * c)
                cur[i] = (cur[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    prev = cur
    rows.append(list(zip(cur[0::bpp], cur[1::bpp], cur[2::bpp])))

def coloured(r, g, b):  # a series colour, not text, grid or background grey
    return max(r, g, b) - min(r, g, b) > 40

total_white = sum(1 for row in rows for (r, g, b) in row if r > 245 and g > 245 and b > 245)
scale = w / 1280.0
report = []
for c in charts:
    x0, y0 = int(c["x"] * scale), int(c["y"] * scale)
    x1, y1 = min(w, int((c["x"] + c["width"]) * scale)), min(h, int((c["y"] + c["height"]) * scale))
    assert y1 > y0 + 20, f"chart {c['id']} is outside the screenshot: {c}"
    n, hues = 0, set()
    for row in rows[y0:y1]:
        for (r, g, b) in row[x0:x1]:
            if coloured(r, g, b):
                n += 1
                hues.add((r >> 5, g >> 5, b >> 5))
    report.append(f"{c['id']}={n}")
    if c["nodata"]:
        assert n < 20, f"'no data' panel {c['id']} has {n} coloured pixels"
    else:
        assert n >= 80, f"chart {c['id']}: only {n} coloured pixels in its box; not drawn?"
        assert len(hues) >= min(3, c["expected"]), f"chart {c['id']}: colours {hues}"
print(f"screenshot {w}x{h}: {total_white / (w * h):.0%} white; coloured pixels per chart: " + " ".join(report))
print("report rendered in chromium:", len(charts), "charts,", sum(c["drawn"] for c in charts), "series drawn")
PY
