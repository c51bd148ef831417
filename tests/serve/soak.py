#!/usr/bin/env python3
"""Soak test of `lockstep serve`: a real server on loopback under abuse.

Serves a tiny model made with `lockstep init` and sends it thousands of
requests from many threads at once: valid ones on every generation endpoint
(streamed and not), malformed JSON, huge and deeply nested bodies, too many
samples, wrong types for every field, unknown fields, broken HTTP, streams
dropped mid-way, clients that trickle their request byte by byte or never
read their answer, a flood of idle connections, bursts of 200 connections
at once, and `/update_weights_from_disk` alternating between two checkpoints all the while. It checks that the server stays up, that every
valid request gets a well-formed answer (greedy answers equal for equal
weights), that every invalid one gets a 4xx JSON error naming its field, and
that resident memory, file descriptors and threads return to their idle
level afterwards.

  python3 tests/serve/soak.py build/release/lockstep                  # CI size
  SOAK_REQUESTS=20000 python3 tests/serve/soak.py build/release/lockstep

Standard library only. Exit status 0 when every check holds; the summary
(requests by kind, failures, memory/fd/thread figures) goes to stdout.
"""
import argparse
import collections
import http.client
import itertools
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

TINY_MODEL = """[model]
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
"""
VOCAB = 300
MAX_BODY = 4 << 20  # --max-body-bytes of the server under test
READ_TIMEOUT = 3  # --request-timeout of the server under test (seconds)
DEPTH = 100000  # nesting of the deeply nested bodies

GEN_PATHS = ["/generate", "/v1/completions", "/v1/chat/completions"]


# --------------------------------------------------------------------------
# The server process and what /proc says about it.

class Server:
    def __init__(self, binary, model, workdir, extra):
        self.err_path = os.path.join(workdir, "serve.err")
        self.err = open(self.err_path, "wb")
        args = [binary, "serve", "--model", model, "--port", "0", "--threads", "1"] + extra
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err)
        line = self.proc.stdout.readline().decode()
        try:  # "lockstep serve: listening on http://127.0.0.1:PORT (...)"
            self.port = int(line.split("http://", 1)[1].split()[0].rsplit(":", 1)[1])
        except (IndexError, ValueError):
            self.proc.kill()
            self.proc.wait()
            raise SystemExit("FAIL: server did not start: %r\n%s" % (line, self.stderr_tail()))
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def alive(self):
        return self.proc.poll() is None

    def stderr_tail(self, n=4000):
        self.err.flush()
        with open(self.err_path, "rb") as f:
            return f.read()[-n:].decode(errors="replace")

    def status_kib(self, key):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
        return -1

    def rss_mib(self):
        return self.status_kib("VmRSS") / 1024.0

    def fds(self):
        return len(os.listdir("/proc/%d/fd" % self.proc.pid))

    def threads(self):
        return len(os.listdir("/proc/%d/task" % self.proc.pid))

    def snapshot(self):
        return {"rss_mib": round(self.rss_mib(), 1), "fds": self.fds(), "threads": self.threads()}

    def stop(self):
        if self.alive():
            self.proc.terminate()
            try:
                return self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                return None
        return self.proc.returncode


class Monitor(threading.Thread):
    """Samples the server's RSS, fds and threads every 50 ms: the peaks."""

    def __init__(self, server):
        super().__init__(daemon=True)
        self.server = server
        self.peak = {"rss_mib": 0.0, "fds": 0, "threads": 0}
        self.running = True

    def run(self):
        while self.running and self.server.alive():
            try:
                s = self.server.snapshot()
            except (OSError, ValueError):
                break
            for k, v in s.items():
                self.peak[k] = max(self.peak[k], v)
            time.sleep(0.05)


# --------------------------------------------------------------------------
# Bookkeeping.

class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = collections.Counter()  # kind -> requests
        self.status = collections.Counter()  # (kind, status) -> count
        self.failures = []
        self.failure_count = 0
        # Greedy /generate answers by (prompt, max_new_tokens, checkpoint):
        # equal weights must give equal tokens whatever else is in the batch.
        self.greedy = {}

    def count(self, kind, status):
        with self.lock:
            self.sent[kind] += 1
            self.status[(kind, status)] += 1

    def fail(self, kind, what):
        with self.lock:
            self.failure_count += 1
            if len(self.failures) < 40:
                self.failures.append("%s: %s" % (kind, what[:600]))

    def check_greedy(self, kind, key, ids):
        with self.lock:
            old = self.greedy.setdefault(key, ids)
        if old != ids:
            self.fail(kind, "greedy answer changed for equal weights: %s vs %s (key %r)" % (old, ids, key))


class Check(Exception):
    pass


def need(cond, what):
    if not cond:
        raise Check(what)


# --------------------------------------------------------------------------
# HTTP helpers.

def http_request(port, method, path, body=b"", headers=None, timeout=60):
    """One request on a fresh connection: (status, content type, body bytes)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        return r.status, r.getheader("Content-Type", ""), r.read()
    finally:
        c.close()


def post_json(port, path, obj, timeout=60):
    return http_request(port, "POST", path, json.dumps(obj).encode(), timeout=timeout)


def check_error(status, ctype, body, field=None, expect=None):
    """A 4xx with OpenAI's JSON error shape whose message names `field`."""
    need(400 <= status < 500, "expected a 4xx, got %d: %r" % (status, body[:300]))
    if expect is not None:
        need(status == expect, "expected %d, got %d: %r" % (expect, status, body[:300]))
    need("application/json" in ctype, "error content type %r" % ctype)
    e = json.loads(body)
    err = e.get("error")
    need(isinstance(err, dict) and isinstance(err.get("message"), str), "error shape: %r" % body[:300])
    need(err.get("code") == status, "error code %r != status %d" % (err.get("code"), status))
    if field is not None:
        need(field in err["message"], "error %r does not name %s" % (err["message"], field))
    return err["message"]


def read_sse(raw):
    """The JSON events of a text/event-stream body; checks the framing and [DONE]."""
    text = raw.decode("utf-8")  # broken UTF-8 raises: a failure
    need(text.endswith("data: [DONE]\n\n"), "stream does not end with [DONE]: %r" % text[-200:])
    events = []
    for block in text.split("\n\n")[:-2]:
        need(block.startswith("data: "), "bad SSE block %r" % block[:200])
        events.append(json.loads(block[6:]))
    return events


# --------------------------------------------------------------------------
# Well-formed answers.

def check_finish(reason, where):
    need(reason in ("stop", "length"), "%s: finish_reason %r" % (where, reason))


def check_generate_item(item, max_new):
    need(isinstance(item.get("text"), str), "text missing: %r" % item)
    ids = item.get("output_ids")
    need(isinstance(ids, list) and 1 <= len(ids) <= max_new, "output_ids %r" % ids)
    need(all(isinstance(t, int) and 0 <= t < VOCAB for t in ids), "token ids %r" % ids)
    m = item["meta_info"]
    need(m["finish_reason"]["type"] in ("stop", "length"), "finish_reason %r" % m["finish_reason"])
    need(m["completion_tokens"] == len(ids), "completion_tokens %r" % m["completion_tokens"])
    need(isinstance(m["weight_version"], int) and isinstance(m["weight_version_end"], int), "versions")
    if "output_token_logprobs" in m:
        lps = m["output_token_logprobs"]
        need(len(lps) == len(ids), "logprobs per token")
        need(all(lp[0] <= 0 and lp[1] == t for lp, t in zip(lps, ids)), "logprob entries %r" % lps[:3])


def check_completions(obj, n_choices, chat):
    need(obj["object"] == ("chat.completion" if chat else "text_completion"), "object %r" % obj.get("object"))
    ch = obj["choices"]
    need(len(ch) == n_choices, "choices %d != %d" % (len(ch), n_choices))
    for i, c in enumerate(ch):
        need(c["index"] == i, "choice index")
        check_finish(c["finish_reason"], "choice %d" % i)
        if chat:
            need(c["message"]["role"] == "assistant" and isinstance(c["message"]["content"], str), "message")
        else:
            need(isinstance(c["text"], str), "text")
    u = obj["usage"]
    need(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], "usage %r" % u)


def check_openai_stream(events, n_choices, chat):
    finished = set()
    usage = False
    for ev in events:
        need(ev["object"] == ("chat.completion.chunk" if chat else "text_completion"), "chunk object")
        if not ev["choices"]:
            need("usage" in ev, "empty choices without usage")
            usage = True
            continue
        for c in ev["choices"]:
            need(c["index"] not in finished, "chunk after the choice's finish_reason")
            if chat:
                need(isinstance(c["delta"], dict), "delta")
            else:
                need(isinstance(c["text"], str), "text")
            if c["finish_reason"] is not None:
                check_finish(c["finish_reason"], "stream choice")
                finished.add(c["index"])
    need(finished == set(range(n_choices)), "choices finished %r of %d" % (sorted(finished), n_choices))
    return usage


# --------------------------------------------------------------------------
# Valid requests.

def rand_text(rng):
    words = ["12+7=", "Hello", "the", "cat", " sat", "on", "mat", "é", "ü", "日本", "\n", "42", "x*y"]
    return "".join(rng.choice(words) for _ in range(rng.randint(1, 8)))


def valid_generate(port, rng, tally, kind):
    greedy = rng.random() < 0.5
    max_new = rng.randint(1, 24)
    sp = {"max_new_tokens": max_new, "temperature": 0 if greedy else 1.0}
    if not greedy:
        sp.update({"n": rng.randint(1, 3), "seed": rng.randint(0, 1000), "top_p": 0.9})
    if rng.random() < 0.3:
        prompt = {"input_ids": [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 20))] for _ in range(2)]}
    elif rng.random() < 0.5:
        prompt = {"input_ids": [rng.randrange(VOCAB) for _ in range(rng.randint(1, 30))]}
    else:
        prompt = {"text": rand_text(rng)}
    body = dict(prompt, sampling_params=sp, return_logprob=rng.random() < 0.5)
    status, ctype, raw = post_json(port, "/generate", body)
    tally.count(kind, status)
    need(status == 200, "status %d: %r" % (status, raw[:300]))
    out = json.loads(raw)
    items = out if isinstance(out, list) else [out]
    batched = isinstance(prompt.get("input_ids", [None])[0], list)
    n_prompts = len(prompt["input_ids"]) if batched else 1
    need(len(items) == n_prompts * sp.get("n", 1), "items %d" % len(items))
    for k, item in enumerate(items):
        check_generate_item(item, max_new)
        m = item["meta_info"]
        if greedy and m["weight_version"] == m["weight_version_end"]:
            p = prompt["input_ids"][k] if batched else prompt.get("input_ids", prompt.get("text"))
            key = (json.dumps(p), max_new, m["weight_version"] % 2)
            tally.check_greedy(kind, key, item["output_ids"])


def valid_openai(port, rng, tally, kind, chat, stream):
    max_tokens = rng.randint(1, 20)
    n = rng.randint(1, 2)
    body = {"model": "tiny", "max_tokens": max_tokens, "n": n, "temperature": rng.choice([0, 0.7, 1.0]),
            "seed": rng.randint(0, 99)}
    if chat:
        body["messages"] = [{"role": "user", "content": rand_text(rng)}]
        if rng.random() < 0.3:
            body["logprobs"] = True
            body["top_logprobs"] = rng.randint(0, 3)
    else:
        body["prompt"] = rand_text(rng) if rng.random() < 0.7 else [rng.randrange(VOCAB) for _ in range(5)]
        if rng.random() < 0.3:
            body["logprobs"] = rng.randint(0, 3)
    if rng.random() < 0.3:
        body["stop"] = ["\n", "the"]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    status, ctype, raw = post_json(port, path, body)
    tally.count(kind, status)
    need(status == 200, "status %d: %r" % (status, raw[:300]))
    if stream:
        need(ctype.startswith("text/event-stream"), "content type %r" % ctype)
        need(check_openai_stream(read_sse(raw), n, chat), "no usage chunk")
    else:
        check_completions(json.loads(raw), n, chat)


def valid_generate_stream(port, rng, tally, kind):
    n = rng.randint(1, 2)
    max_new = rng.randint(1, 16)
    body = {"text": rand_text(rng), "stream": True,
            "sampling_params": {"max_new_tokens": max_new, "n": n, "seed": rng.randint(0, 99)}}
    status, ctype, raw = post_json(port, "/generate", body)
    tally.count(kind, status)
    need(status == 200, "status %d: %r" % (status, raw[:300]))
    last = {}
    for ev in read_sse(raw):
        if ev["meta_info"]["finish_reason"] is not None:
            need(ev["index"] not in last, "two final chunks")
            last[ev["index"]] = ev
    need(sorted(last) == list(range(n)), "final chunks %r" % sorted(last))
    for ev in last.values():
        check_generate_item(ev, max_new)


# --------------------------------------------------------------------------
# Invalid requests.

MALFORMED = [
    b"", b"{", b"}", b"[", b"{\"text\": ", b"{\"text\": \"abc}", b"{\"text\": \"a\",}", b"{'text': 'a'}",
    b"{\"text\": \"a\"} trailing", b"null", b"42", b"\"a string\"", b"[1, 2, 3]", b"true", b"NaN",
    b"{\"text\": NaN}", b"{\"text\": \"\xff\xfe\"}", b"{\"text\": \"\\ud800\"}", b"\xef\xbb\xbf{\"text\": 1",
    b"{\"text\": \"a\x01b\"}", b"{\"sampling_params\": {\"temperature\": 1e999}, \"text\": \"a\"}",
    b"{\"text\": \"a\", \"sampling_params\": {\"max_new_tokens\": 99999999999999999999999}}",
    b"{\"a\":" * 50 + b"1", b"\x00\x00\x00\x00", b"{\"text\": \"a\"}\x00",
]

# A probe value per JSON type; the server must reject each one that is not a
# valid value of the field with a message naming it (or accept it whole).
BAD_VALUES = [{"x": 1}, [{"y": 2}], "str", True, 1.5, -7, 10 ** 30, [], {}]


def field_names(port, path, where):
    """The accepted keys the server lists when it rejects an unknown one."""
    base = base_body(path)
    if where == "sampling_params":
        base["sampling_params"] = {"max_new_tokens": 2, "no_such_key": 1}
        expect = "sampling_params.no_such_key"
    else:
        base["no_such_key"] = 1
        expect = "no_such_key"
    status, ctype, raw = post_json(port, path, base)
    msg = check_error(status, ctype, raw, field=expect, expect=400)
    names = msg.split("(accepted: ", 1)[1].rstrip(")").split(", ")
    return [n for n in names if n]


def base_body(path):
    if path == "/generate":
        return {"text": "hi", "sampling_params": {"max_new_tokens": 2}}
    if path == "/v1/completions":
        return {"prompt": "hi", "max_tokens": 2}
    return {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def wrong_type(port, rng, tally, kind, fields):
    path = rng.choice(GEN_PATHS)
    where, name = rng.choice(fields[path])
    value = rng.choice(BAD_VALUES)
    body = base_body(path)
    if where == "sampling_params":
        body["sampling_params"] = dict(body["sampling_params"], **{name: value})
        field = "sampling_params." + name
    else:
        body[name] = value
        field = name
    status, ctype, raw = post_json(port, path, body)
    tally.count(kind, status)
    if status == 200:  # a value the field takes: the answer must be complete
        need(raw.startswith(b"{") or raw.startswith(b"[") or raw.startswith(b"data: "), "answer %r" % raw[:200])
        if raw.startswith(b"data: "):
            read_sse(raw)
        else:
            json.loads(raw)
        return
    check_error(status, ctype, raw, field=field, expect=400)


def unknown_field(port, rng, tally, kind):
    path = rng.choice(GEN_PATHS)
    body = base_body(path)
    name = "unknown_%d" % rng.randrange(10 ** 6)
    if path == "/generate" and rng.random() < 0.5:
        body["sampling_params"][name] = rng.choice(BAD_VALUES)
        field = "sampling_params." + name
    else:
        body[name] = rng.choice(BAD_VALUES)
        field = name
    status, ctype, raw = post_json(port, path, body)
    tally.count(kind, status)
    check_error(status, ctype, raw, field=field, expect=400)


def malformed(port, rng, tally, kind):
    path = rng.choice(GEN_PATHS + ["/update_weights_from_disk"])
    body = rng.choice(MALFORMED)
    status, ctype, raw = http_request(port, "POST", path, body)
    tally.count(kind, status)
    check_error(status, ctype, raw, expect=400)


def deep_nesting(port, rng, tally, kind):
    path = rng.choice(GEN_PATHS + ["/update_weights_from_disk"])
    shape = rng.randrange(4)
    if shape == 0:
        body = b"[" * DEPTH + b"]" * DEPTH  # balanced: valid JSON
    elif shape == 1:
        body = b"[" * DEPTH  # unbalanced
    elif shape == 2:
        body = b"{\"text\": " + b"[" * DEPTH + b"]" * DEPTH + b"}"
    else:
        body = b"{\"a\": " * DEPTH + b"1" + b"}" * DEPTH
    status, ctype, raw = http_request(port, "POST", path, body)
    tally.count(kind, status)
    check_error(status, ctype, raw, expect=400)


def huge_body(port, rng, tally, kind):
    path = rng.choice(GEN_PATHS)
    r = rng.randrange(4)
    if r == 0:  # over the limit: 413 (the body is read and dropped)
        body = b"{\"text\": \"" + b"a" * (MAX_BODY + 1000) + b"\"}"
        status, ctype, raw = http_request(port, "POST", path, body)
        tally.count(kind, status)
        check_error(status, ctype, raw, expect=413)
    elif r == 1:  # under the limit, an unknown field of MBs
        body = base_body(path)
        body["padding"] = "p" * (MAX_BODY // 2)
        status, ctype, raw = post_json(port, path, body)
        tally.count(kind, status)
        check_error(status, ctype, raw, field="padding", expect=400)
    else:  # under the limit, a prompt of MBs (words, or one word): too long for the context
        words = ["the ", "cat ", "12+7= ", "日本 "]
        if r == 2:
            text = "".join(rng.choice(words) for _ in range(MAX_BODY // 16))
        else:
            text = "a" * (MAX_BODY - 200)
        body = {"/generate": {"text": text}, "/v1/completions": {"prompt": text},
                "/v1/chat/completions": {"messages": [{"role": "user", "content": text}]}}[path]
        status, ctype, raw = post_json(port, path, body)
        tally.count(kind, status)
        check_error(status, ctype, raw, field="context", expect=400)


def bad_update(port, rng, tally, kind):
    body = rng.choice([{"model_path": "/nonexistent/ckpt"}, {"model_path": 5}, {"model_path": ""},
                       {"model_path": "/tmp", "weight_version": "abc"}, {"weight_version": 3},
                       {"model_path": "/tmp", "bogus": 1}, {"model_path": "/tmp", "abort_all_requests": "yes"}])
    status, ctype, raw = post_json(port, "/update_weights_from_disk", body)
    tally.count(kind, status)
    check_error(status, ctype, raw, expect=400)


def bad_http(port, rng, tally, kind):
    """Broken HTTP on a raw socket: the server answers 4xx or closes."""
    variants = [
        b"GARBAGE\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n{}",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nX-Long: " + b"h" * 20000 + b"\r\n\r\n",
        b"GET /" + b"u" * 20000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: 100000000\r\n\r\n{\"text\"",
        b"GET /no/such/path HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"DELETE /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    ]
    i = rng.randrange(len(variants))
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        try:
            s.sendall(variants[i])
            s.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the server may close first (a header past its limit)
        data = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (ConnectionResetError, socket.timeout) as e:
            need(not isinstance(e, socket.timeout), "no answer to broken HTTP variant %d" % i)
    finally:
        s.close()
    status = int(data.split(b" ", 2)[1]) if data.startswith(b"HTTP/1.1 ") else 0
    tally.count(kind, status)
    need(status == 0 or 400 <= status < 500, "variant %d: status %d" % (i, status))


def chunked_valid(port, rng, tally, kind):
    """A valid request with a chunked body (no Content-Length)."""
    body = json.dumps({"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 3}}).encode()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        c.putrequest("POST", "/generate")
        c.putheader("Content-Type", "application/json")
        c.putheader("Transfer-Encoding", "chunked")
        c.endheaders()
        for i in range(0, len(body), 7):
            part = body[i:i + 7]
            c.send(b"%x\r\n%s\r\n" % (len(part), part))
        c.send(b"0\r\n\r\n")
        r = c.getresponse()
        raw = r.read()
        tally.count(kind, r.status)
        need(r.status == 200, "status %d: %r" % (r.status, raw[:300]))
        check_generate_item(json.loads(raw), 3)
    finally:
        c.close()


def drop_mid_stream(port, rng, tally, kind):
    """A streamed request closed after a few chunks (sometimes with a reset)."""
    path = rng.choice(GEN_PATHS)
    body = base_body(path)
    body["stream"] = True
    if path == "/generate":
        body["sampling_params"] = {"max_new_tokens": 200, "ignore_eos": True, "n": 2}
    else:
        body["max_tokens"] = 200
        body["ignore_eos"] = True
    data = json.dumps(body).encode()
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        s.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                  % (path.encode(), len(data), data))
        got = b""
        want = rng.randint(1, 6)
        while got.count(b"data: ") < want:
            chunk = s.recv(4096)
            need(chunk, "stream ended after %d chunks" % got.count(b"data: "))
            got += chunk
        need(got.startswith(b"HTTP/1.1 200"), "status line %r" % got[:40])
        if rng.random() < 0.5:  # an abortive close: RST instead of FIN
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        tally.count(kind, 200)
    finally:
        s.close()


def too_many_samples(port, rng, tally, kind):
    """prompts x n past the server's --max-samples (65536 by default)."""
    n = rng.randint(17, 64)
    if rng.random() < 0.5:
        path, body, field = "/generate", {"input_ids": [[1]] * 4096, "sampling_params": {"n": n}}, "sampling_params.n"
    else:
        path, body, field = "/v1/completions", {"prompt": [[1]] * 4096, "n": n}, "x n"
    status, ctype, raw = post_json(port, path, body)
    tally.count(kind, status)
    check_error(status, ctype, raw, field=field, expect=400)


def not_found(port, rng, tally, kind):
    method, path = rng.choice([("GET", "/nope"), ("POST", "/v1/embeddings"), ("GET", "/generate"),
                               ("PUT", "/generate")])
    status, ctype, raw = http_request(port, method, path, b"{}")
    tally.count(kind, status)
    need(400 <= status < 500, "status %d" % status)
    if status == 404:
        check_error(status, ctype, raw, expect=404)


def admin(port, rng, tally, kind):
    path = rng.choice(["/health", "/get_model_info", "/metrics", "/v1/models", "/flush_cache"])
    method = "POST" if path == "/flush_cache" else "GET"
    status, ctype, raw = http_request(port, method, path)
    tally.count(kind, status)
    need(status == 200, "%s: %d %r" % (path, status, raw[:200]))
    if path in ("/get_model_info", "/v1/models", "/flush_cache"):
        json.loads(raw)


# --------------------------------------------------------------------------
# Abusive clients beside the storm.

def slow_client(port, tally, stop, deadline_s):
    """Trickles a valid request byte by byte. One that arrives well within
    the server's --request-timeout must be answered; one slower than it may be
    cut off (408 or a closed connection), but never answered wrongly."""
    gaps = [0.04, 0.002, 0.01]  # seconds per byte: ~7 s in all (cut off), 0.35 s, 1.7 s
    for round_ in itertools.count():
        if stop.is_set():
            break
        body = json.dumps({"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}}).encode()
        req = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
        gap = gaps[round_ % len(gaps)]
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        data = b""
        first = time.time()
        last = first
        try:
            for i in range(len(req)):
                try:
                    s.sendall(req[i:i + 1])
                except OSError:
                    break  # cut off while sending
                last = time.time()
                time.sleep(gap)
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError:
                pass
        finally:
            s.close()
        # Measured, not nominal: on a loaded machine the sleeps run long. A
        # request fully sent well inside the deadline must have been answered.
        sent_in = last - first
        if data.startswith(b"HTTP/1.1 200"):
            tally.count("slow client (answered)", 200)
            try:
                out = json.loads(data.split(b"\r\n\r\n", 1)[1])
                need(isinstance(out.get("output_ids"), list) and len(out["output_ids"]) >= 1, "answer")
            except (Check, ValueError, IndexError):
                tally.fail("slow client", "bad answer %r" % data[:300])
        elif sent_in > deadline_s - 0.5 and (not data or data.startswith(b"HTTP/1.1 408")):
            tally.count("slow client (cut off)", 408 if data else 0)
        else:
            tally.count("slow client (wrong)", 0)
            tally.fail("slow client", "gap %.3f s, sent in %.1f s: %r" % (gap, sent_in, data[:300]))


def never_reader(port, tally, stop):
    """Sends long streamed requests and never reads the answer, then leaves."""
    while not stop.is_set():
        body = json.dumps({"input_ids": [1, 2, 3], "stream": True, "return_logprob": True,
                           "sampling_params": {"max_new_tokens": 200, "n": 8, "ignore_eos": True}}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.settimeout(30)
        s.connect(("127.0.0.1", port))
        s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        stop.wait(8.0)
        s.close()
        tally.count("never reads its answer", 0)


def idle_flood(port, tally, stop, count):
    """Opens `count` connections that send nothing, holds them, repeats."""
    while not stop.is_set():
        socks = []
        for _ in range(count):
            try:
                socks.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            except OSError:
                break
        tally.count("idle connections", len(socks))
        stop.wait(4.0)
        for s in socks:
            s.close()


def connection_burst(port, tally, stop, count):
    """`count` connections at once, each with one small valid request sent
    before any answer is read: more than --http-threads, so most wait in the
    queue; every one must be answered."""
    body = json.dumps({"input_ids": [9, 8, 7], "sampling_params": {"max_new_tokens": 2}}).encode()
    req = (b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body))
    while not stop.is_set():
        socks = []
        for _ in range(count):
            s = socket.create_connection(("127.0.0.1", port), timeout=60)
            s.sendall(req)
            socks.append(s)
        for s in socks:
            data = b""
            try:
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    data += chunk
            except OSError as e:
                data = b"%r" % e
            finally:
                s.close()
            ok = data.startswith(b"HTTP/1.1 200") and b"output_ids" in data
            tally.count("connection burst", 200 if ok else 0)
            if not ok:
                tally.fail("connection burst", "answer %r" % data[:300])
        stop.wait(2.0)


def updater(port, tally, stop, ckpts, first_version):
    """/update_weights_from_disk during traffic, alternating two checkpoints:
    checkpoint version % 2 (the greedy check keys on it)."""
    version = first_version
    while not stop.is_set():
        version += 1
        status, ctype, raw = post_json(port, "/update_weights_from_disk",
                                       {"model_path": ckpts[version % 2], "weight_version": version}, timeout=120)
        tally.count("update_weights_from_disk", status)
        try:
            need(status == 200, "status %d: %r" % (status, raw[:300]))
            out = json.loads(raw)
            need(out["success"] is True and out["weight_version"] == version, "answer %r" % out)
        except (Check, ValueError, KeyError) as e:
            tally.fail("update_weights_from_disk", str(e))
        stop.wait(0.3)


# --------------------------------------------------------------------------
# The storm.

def kinds(fields):
    """(name, weight, function(port, rng, tally, kind))."""
    return [
        ("valid /generate", 20, valid_generate),
        ("valid /generate stream", 6, valid_generate_stream),
        ("valid /v1/completions", 8, lambda p, r, t, k: valid_openai(p, r, t, k, False, False)),
        ("valid /v1/completions stream", 5, lambda p, r, t, k: valid_openai(p, r, t, k, False, True)),
        ("valid /v1/chat/completions", 8, lambda p, r, t, k: valid_openai(p, r, t, k, True, False)),
        ("valid /v1/chat/completions stream", 5, lambda p, r, t, k: valid_openai(p, r, t, k, True, True)),
        ("valid chunked body", 2, chunked_valid),
        ("admin endpoints", 3, admin),
        ("malformed JSON", 10, malformed),
        ("wrong type", 20, lambda p, r, t, k: wrong_type(p, r, t, k, fields)),
        ("unknown field", 6, unknown_field),
        ("deep nesting", 2, deep_nesting),
        ("huge body", 1, huge_body),
        ("bad /update_weights_from_disk", 2, bad_update),
        ("broken HTTP", 4, bad_http),
        ("no such endpoint", 2, not_found),
        ("too many samples", 1, too_many_samples),
        ("dropped mid-stream", 5, drop_mid_stream),
    ]


def storm(port, total, concurrency, seed, fields, tally, min_seconds=0.0):
    """`total` requests (more if they take less than min_seconds) from
    `concurrency` threads, each kind drawn by its weight. Returns the count."""
    table = kinds(fields)
    names = [k[0] for k in table]
    weights = [k[1] for k in table]
    funcs = {k[0]: k[2] for k in table}
    lock = threading.Lock()
    sent = [0]
    until = time.time() + min_seconds

    def worker(i):
        rng = random.Random(seed * 1000 + i)
        while True:
            with lock:
                if sent[0] >= total and time.time() >= until:
                    return
                sent[0] += 1
            kind = rng.choices(names, weights)[0]
            try:
                funcs[kind](port, rng, tally, kind)
            except Check as e:
                tally.fail(kind, str(e))
            except (OSError, http.client.HTTPException, ValueError, KeyError, TypeError, IndexError) as e:
                tally.count(kind, "exception")
                tally.fail(kind, "%s: %s" % (type(e).__name__, e))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sent[0]


def wait_idle(port, server, timeout=60):
    """Until no generation request is in flight, then two housekeeping ticks."""
    end = time.time() + timeout
    while time.time() < end:
        status, _, raw = http_request(port, "GET", "/metrics")
        m = dict(l.split(" ", 1) for l in raw.decode().splitlines() if l and not l.startswith("#"))
        busy = sum(float(m["lockstep_" + k]) for k in ("num_running_reqs", "num_waiting_reqs",
                                                       "num_http_requests_in_flight"))
        if busy == 0:
            time.sleep(2.5)  # the server trims its heap on the next idle tick (1 s)
            return True
        time.sleep(0.2)
    return False


def settle(server, base, timeout=15):
    """Connections close a little after their clients leave: wait for fds and
    threads to come back down to `base` (or the timeout)."""
    end = time.time() + timeout
    while time.time() < end:
        s = server.snapshot()
        if s["fds"] <= base["fds"] and s["threads"] <= base["threads"]:
            return s
        time.sleep(0.2)
    return server.snapshot()


def make_models(binary, work):
    with open(os.path.join(work, "tiny.toml"), "w") as f:
        f.write(TINY_MODEL)
    ckpts = []
    for s in (1, 2):
        out = os.path.join(work, "m%d" % s)
        subprocess.run([binary, "init", "--config", os.path.join(work, "tiny.toml"), "--out", out,
                        "--seed", str(s)], check=True, stdout=subprocess.DEVNULL)
        ckpts.append(out)
    return ckpts


def discover_fields(port):
    """Every key of every generation API, as the server lists them."""
    fields = {}
    for path in GEN_PATHS:
        fields[path] = [("", n) for n in field_names(port, path, "") if n != "sampling_params"]
    fields["/generate"] += [("sampling_params", n) for n in field_names(port, "/generate", "sampling_params")]
    return fields


def warm_up(port, server, args, fields, ckpts, tally):
    """Every kind of request, two weight updates: pools, arenas and caches
    reach their working size before the idle level is measured."""
    storm(port, 300, args.concurrency, args.seed + 100, fields, tally)
    for v in (1001, 1002):
        st, _, raw = post_json(port, "/update_weights_from_disk", {"model_path": ckpts[v % 2], "weight_version": v})
        need(st == 200, "warm-up update: %r" % raw)
    need(wait_idle(port, server), "the server did not go idle after the warm-up")
    return server.snapshot()


def run_storm(port, server, args, fields, ckpts, tally):
    """The storm with the abusive side clients and the weight updater beside it."""
    stop = threading.Event()
    side = [threading.Thread(target=slow_client, args=(port, tally, stop, READ_TIMEOUT)),
            threading.Thread(target=slow_client, args=(port, tally, stop, READ_TIMEOUT)),
            threading.Thread(target=never_reader, args=(port, tally, stop)),
            threading.Thread(target=idle_flood, args=(port, tally, stop, 16)),
            threading.Thread(target=connection_burst, args=(port, tally, stop, 200)),
            threading.Thread(target=updater, args=(port, tally, stop, ckpts, 1002))]
    mon = Monitor(server)
    mon.start()
    t0 = time.time()
    for t in side:
        t.start()
    sent = storm(port, args.requests, args.concurrency, args.seed, fields, tally, args.min_seconds)
    stop.set()
    for t in side:
        t.join(60)
    mon.running = False
    mon.join()
    return sent, time.time() - t0, mon.peak


def after_checks(port, server, idle, args, tally):
    """The server is up, answers every endpoint, and is back at its idle level."""
    need(server.alive(), "the server died: exit status %r" % server.proc.returncode)
    need(wait_idle(port, server), "the server did not go idle after the storm")
    after = settle(server, idle)
    rng = random.Random(99)
    for kind, fn in (("after: /generate", valid_generate), ("after: /generate stream", valid_generate_stream),
                     ("after: completions", lambda p, r, t, k: valid_openai(p, r, t, k, False, False)),
                     ("after: chat stream", lambda p, r, t, k: valid_openai(p, r, t, k, True, True))):
        try:
            fn(port, rng, tally, kind)
        except Check as e:
            tally.fail(kind, str(e))
    rss_bound = idle["rss_mib"] * 1.2 + args.rss_slack_mib
    problems = []
    if after["rss_mib"] > rss_bound:
        problems.append("RSS %.1f MiB after the storm > bound %.1f MiB (idle %.1f)"
                        % (after["rss_mib"], rss_bound, idle["rss_mib"]))
    if after["fds"] > idle["fds"]:
        problems.append("file descriptors leaked: %d idle, %d after" % (idle["fds"], after["fds"]))
    if after["threads"] > idle["threads"]:
        problems.append("threads leaked: %d idle, %d after" % (idle["threads"], after["threads"]))
    return after, rss_bound, problems


def report(args, tally, idle, peak, after, rss_bound, sent, elapsed):
    total = sum(tally.sent.values())
    print("requests: %d in all, %d of them in the storm (%d threads, %.1f s; the rest warm-up, side clients,"
          " checks)" % (total, sent, args.concurrency, elapsed))
    print("%-36s %7s  statuses" % ("kind", "count"))
    for kind in sorted(tally.sent):
        st = sorted(((s, c) for (k, s), c in tally.status.items() if k == kind), key=lambda x: str(x[0]))
        print("%-36s %7d  %s" % (kind, tally.sent[kind], " ".join("%s:%d" % (s, c) for s, c in st)))
    print("memory/fds/threads: idle %s, peak %s, after %s; RSS bound %.1f MiB (idle * 1.2 + %.0f)"
          % (idle, peak, after, rss_bound, args.rss_slack_mib))
    print("greedy answers cross-checked: %d distinct (prompt, length, checkpoint) keys" % len(tally.greedy))
    print("failures: %d" % tally.failure_count)
    for f in tally.failures:
        print("  " + f)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lockstep", help="the lockstep binary")
    ap.add_argument("--requests", type=int, default=int(os.environ.get("SOAK_REQUESTS", "4000")))
    ap.add_argument("--concurrency", type=int, default=int(os.environ.get("SOAK_CONCURRENCY", "24")))
    ap.add_argument("--seed", type=int, default=int(os.environ.get("SOAK_SEED", "1")))
    ap.add_argument("--min-seconds", type=float, default=float(os.environ.get("SOAK_MIN_SECONDS", "15")),
                    help="the storm lasts at least this long, so that the slow clients have their turn")
    ap.add_argument("--rss-slack-mib", type=float, default=float(os.environ.get("SOAK_RSS_SLACK_MIB", "24")),
                    help="after the storm RSS must be <= idle RSS * 1.2 + this (default 24; SOAK_RSS_SLACK_MIB)")
    args = ap.parse_args()

    work = tempfile.mkdtemp(prefix="lockstep_soak_")
    ckpts = make_models(args.lockstep, work)
    server = Server(args.lockstep, ckpts[0], work,
                    ["--max-body-bytes", str(MAX_BODY), "--request-timeout", str(READ_TIMEOUT), "--seed", "3"])
    tally = Tally()
    problems = []
    try:
        fields = discover_fields(server.port)
        idle = warm_up(server.port, server, args, fields, ckpts, tally)
        print("idle after warm-up: %s" % idle, flush=True)
        sent, elapsed, peak = run_storm(server.port, server, args, fields, ckpts, tally)
        after, rss_bound, problems = after_checks(server.port, server, idle, args, tally)
        report(args, tally, idle, peak, after, rss_bound, sent, elapsed)
    except (Check, OSError, http.client.HTTPException, ValueError, KeyError) as e:
        problems.append("%s: %s" % (type(e).__name__, e))
    finally:
        code = server.stop()  # also on an unexpected exception: no server left behind
    if code != 0:
        problems.append("server exit status %r after SIGTERM (want 0)" % code)
    if tally.failure_count:
        problems.append("%d requests failed their checks" % tally.failure_count)
    if problems:
        print("server stderr (tail):\n" + server.stderr_tail())
        for p in problems:
            print("FAIL: " + p)
        return 1
    shutil.rmtree(work, ignore_errors=True)  # kept on failure, for its serve.err
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
