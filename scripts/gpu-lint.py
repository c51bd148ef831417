#!/usr/bin/env python3
"""The float lint of the GPU kernel sources (src/lockstep/kernels/gpu/*.cu).

Compiles one .cu file's device code with the build's own flags and fails on any
instruction that could make the device's bits differ from the CPU kernels':
approximate or flushing instructions, float ops a compiler may fuse, hardware
transcendentals, float atomics, tensor cores (docs/gpu.md, "The float lint").

  gpu-lint.py ptx    --compiler NVCC  FILE.cu -- FLAGS...   (nvcc -ptx)
  gpu-lint.py gfx90a --compiler HIPCC FILE.cu -- FLAGS...   (hipcc device asm + IR)

FLAGS are the build's compile flags for that file (cmake/gpu.cmake passes them).
With --planted, FILE is a deliberately bad source (tests/gpu/lint/): its
comments `// LINT-EXPECT(CHECK): REGEX` say what the report must contain,
`// LINT-DROP-FLAG(CHECK): FLAG` / `// LINT-ADD-FLAG(CHECK): FLAG` change the
flags first, and the run passes only when the lint rejects the file with every
expected message. Exit status: 0 clean (or planted and rejected as expected),
1 findings (or planted and not rejected as expected), 2 compile or usage error.
"""
from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

Finding = collections.namedtuple("Finding", "function where text reason")


def rel(path: str) -> str:
    """Path relative to the repository when inside it (shorter reports)."""
    try:
        return str(pathlib.Path(path).resolve().relative_to(ROOT))
    except (ValueError, OSError):
        return path


def demangle(names):
    names = sorted(set(names))
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def compile_to(cmd, what):
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.stderr.write(f"gpu-lint: {what} failed:\n  {shlex.join(cmd)}\n{res.stdout}{res.stderr}")
        sys.exit(2)


# --- PTX (nvcc) -----------------------------------------------------------------

PTX_FLOAT = {"f16", "f16x2", "bf16", "bf16x2", "f32", "f32x2", "f64", "tf32"}
PTX_FUNC = re.compile(r"^\s*(?:\.(?:visible|weak|extern)\s+)*\.(entry|func)\s+(?:\([^)]*\)\s*)?([\w$.]+)")
PTX_LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+(?:.*inlined_at\s+(\d+)\s+(\d+)\s+\d+)?")
PTX_FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
PTX_ARITH = {"add", "sub", "mul", "fma", "mad"}


def ptx_reason(op: str) -> str | None:
    """Why one PTX opcode (e.g. 'fma.rn.f32') may not appear in a canonical kernel."""
    parts = op.split(".")
    base, mods = parts[0], set(parts[1:])
    is_float = bool(mods & PTX_FLOAT)
    if base in {"mma", "wgmma", "wmma"} or op.startswith("tcgen05.mma"):
        return "tensor-core op (own accumulation order and rounding)"
    if (base in {"atom", "red"} or op.startswith(("cp.reduce", "multimem"))) and is_float:
        return "float atomic/reduction (order depends on timing)"
    if base in {"ex2", "lg2", "sin", "cos", "tanh"}:
        return "hardware transcendental (approximate): use lockstep::num"
    if base == "rsqrt":
        return "rsqrt is approximate: write ls_div(1, ls_sqrt(x))"
    if "approx" in mods:
        return "approximate instruction"
    if "ftz" in mods:
        return "flushes subnormals to zero"
    if base == "div" and is_float and "full" in mods:
        return "div.full is approximate (2 ulp)"
    if base in PTX_ARITH | {"div", "sqrt", "rcp"} and is_float and "rn" not in mods:
        return "float op without .rn (ptxas may fuse it, or it rounds the wrong way)"
    return None


def ptx_scan(text: str):
    """Yields (function, location, instruction) for each instruction of the PTX."""
    files = {m.group(1): m.group(2) for m in map(PTX_FILE.match, text.splitlines()) if m}
    func, where = "(module)", ""
    for line in text.splitlines():
        code = line.split("//", 1)[0].strip()
        m = PTX_FUNC.match(code)
        if m:
            func, where = m.group(2), ""
            continue
        m = PTX_LOC.match(code)
        if m:
            where = f"{rel(files.get(m.group(1), '?'))}:{m.group(2)}"
            if m.group(3):
                where += f" (inlined at {rel(files.get(m.group(3), '?'))}:{m.group(4)})"
            continue
        if not code or code[0] in ".{}$" or code.endswith(":"):
            continue
        code = re.sub(r"^@!?%\w+\s+", "", code).rstrip(";").strip()
        if code and re.match(r"[a-z]", code):
            yield func, where, code


def float_arith_by_line(text: str):
    """The float add/sub/mul/fma/mad opcodes of each (function, source line)."""
    out = collections.defaultdict(collections.Counter)
    for func, where, code in ptx_scan(text):
        op = code.split()[0]
        parts = op.split(".")
        if parts[0] in PTX_ARITH and set(parts[1:]) & PTX_FLOAT:
            out[(func, where)][op] += 1
    return out


def flip_fmad(flags):
    """The flags with --fmad the other way (nvcc's default is --fmad=true)."""
    if "--fmad=false" in flags:
        return [("--fmad=true" if f == "--fmad=false" else f) for f in flags]
    return [f for f in flags if not f.startswith("--fmad")] + ["--fmad=false"]


def lint_ptx(compiler, src, flags, tmp):
    ptx = {}
    for name, fl in (("build", flags), ("flipped", flip_fmad(flags))):
        out = os.path.join(tmp, f"{name}.ptx")
        compile_to([compiler, *fl, "-ptx", "-lineinfo", src, "-o", out], f"nvcc -ptx ({name} flags)")
        ptx[name] = pathlib.Path(out).read_text()
    findings = []
    for func, where, code in ptx_scan(ptx["build"]):
        reason = ptx_reason(code.split()[0])
        if reason:
            findings.append(Finding(func, where, code, reason))
    # ls_add/ls_mul/ls_fma are __fadd_rn/__fmul_rn/__fmaf_rn: --fmad cannot touch
    # them. A line whose float ops change with --fmad has plain + - * on floats.
    a, b = float_arith_by_line(ptx["build"]), float_arith_by_line(ptx["flipped"])
    for key in sorted(set(a) | set(b)):
        ca, cb = a.get(key, collections.Counter()), b.get(key, collections.Counter())
        if ca != cb:
            ops = lambda c: " ".join(f"{n}x{op}" if n > 1 else op for op, n in sorted(c.items())) or "-"
            findings.append(Finding(key[0], key[1], f"{ops(ca - cb)}  (with --fmad flipped: {ops(cb - ca)})",
                                    "float ops change with --fmad: plain float operators (use ls_add/ls_mul/ls_fma)"))
    return findings


# --- gfx90a (hipcc) -------------------------------------------------------------

AMD_TRANSCENDENTAL = re.compile(r"^v_(exp|log)(_legacy)?_f(16|32)|^v_(sin|cos)_f(16|32)|^v_rsq_f(16|32|64)|^v_rcp_f16|^v_sqrt_f16")
AMD_LEGACY_MAD = re.compile(r"^v_(mad|mac|madak|madmk|fma|fmac|mul)_legacy_f32|^v_(mad|mac|madak|madmk)_f32")
AMD_FLOAT_ATOMIC = re.compile(r"^(ds|global|flat|buffer|scratch)_\w*?(pk_add|(add|sub|min|max|cmpst|cmpswap)(_rtn)?_(f16|bf16|f32|f64))")
AMD_LABEL = re.compile(r"^([A-Za-z_][\w$]*):")  # function symbols; .LBB labels start with '.'

AMD_LOC = re.compile(r"^\s*\.loc\s.*;\s*(\S+):(\d+):\d+")


def amd_scan(text: str):
    """Instructions of the device asm, each (function, location, code). The asm
    has no inlining chain: a location in a header also names the last line of a
    .cu file seen before it."""
    func, where, last_cu = "(module)", "", ""
    out = []
    for line in text.splitlines():
        m = AMD_LABEL.match(line)
        if m:
            func, where, last_cu = m.group(1), "", ""
            continue
        m = AMD_LOC.match(line)
        if m:
            where = f"{rel(m.group(1))}:{m.group(2)}"
            if m.group(1).endswith(".cu"):
                last_cu = where
            elif last_cu:
                where += f" (after {last_cu})"
            continue
        code = line.split(";", 1)[0].strip()
        if code and re.match(r"[sv]_|ds_|global_|flat_|buffer_|scratch_", code):
            out.append((func, where, code))
    return out


def operands(code: str):
    """The operands of one instruction; the first is the destination."""
    parts = code.split(None, 1)
    return [o.strip() for o in parts[1].split(",")] if len(parts) > 1 else []


def last_writer(instrs, i, reg, limit=64):
    """Index of the latest instruction before i in the same function that
    writes reg (None if not within limit)."""
    for j in range(i - 1, max(-1, i - 1 - limit), -1):
        if instrs[j][0] != instrs[i][0]:
            return None
        ops = operands(instrs[j][2])
        if ops and ops[0] == reg:
            return j
    return None


def operand_value(instrs, i, op):
    """op, or the literal a v_mov_b32 put in that register just before."""
    j = last_writer(instrs, i, op, limit=16) if re.fullmatch(r"v\d+", op) else None
    if j is not None and instrs[j][2].startswith("v_mov_b32"):
        return operands(instrs[j][2])[1]
    return op


# LLVM expands 64-bit integer division with a float reciprocal estimate that
# integer steps then correct exactly: float(lo) + 2^32 * float(hi) by v_mac_f32,
# v_rcp_f32, a scale by 0x5f7ffffc, and a v_mac_f32 by -2^32.
INT_DIV_CONST = ("0x4f800000", "0xcf800000")


def int_division_mac(instrs, i) -> bool:
    return any(operand_value(instrs, i, o) in INT_DIV_CONST for o in operands(instrs[i][2])[1:])


def rcp_allowed(instrs, i) -> bool:
    # The IEEE f32/f64 division (v_div_scale, v_rcp, Newton fma steps,
    # v_div_fmas, v_div_fixup) is correctly rounded as a whole: its v_rcp reads a
    # v_div_scale result. The integer division's reads the 2^32 v_mac, and its
    # result is scaled by 0x5f7ffffc next.
    ops = operands(instrs[i][2])
    if len(ops) < 2:
        return False
    j = last_writer(instrs, i, ops[1])
    if j is not None and (instrs[j][2].startswith("v_div_scale")
                          or (instrs[j][2].startswith("v_mac_f32") and int_division_mac(instrs, j))):
        return True
    dst = re.escape(ops[0])
    return any(re.match(rf"v_mul_f32\w*\s+v\d+,\s*0x5f7ffffc,\s*{dst}$", c)
               for f, _, c in instrs[i + 1:i + 9] if f == instrs[i][0])


def rounded_sqrt(instrs, i) -> bool:
    # ocml's correctly rounded sqrtf: s = v_sqrt_f32(x), then the neighbours
    # s-1ulp and s+1ulp (v_add_u32 -1 / 1 on s's bits) are tested with fma
    # residuals. Unrolled loops interleave two of them, hence the wide window.
    ops = operands(instrs[i][2])
    if not ops:
        return False
    s = re.escape(ops[0])
    later = [c for f, _, c in instrs[i + 1:i + 49] if f == instrs[i][0]]
    return any(re.match(rf"v_add_u32\w*\s+v\d+,\s*-1,\s*{s}$", c) for c in later) and any(
        re.match(rf"v_add_u32\w*\s+v\d+,\s*1,\s*{s}$", c) for c in later)


def amd_reason(instrs, i) -> str | None:
    code = instrs[i][2]
    op = code.split()[0]
    if op.startswith(("v_mfma", "v_smfmac")):
        return "matrix-core op (own accumulation order and rounding)"
    if AMD_TRANSCENDENTAL.match(op):
        return "hardware transcendental / reciprocal square root (approximate): use lockstep::num"
    if re.match(r"v_rcp_f(32|64)", op) and not rcp_allowed(instrs, i):
        return "v_rcp outside the IEEE division and integer division sequences (1 ulp)"
    if re.match(r"v_sqrt_f32", op) and not rounded_sqrt(instrs, i):
        return "bare v_sqrt_f32 (1 ulp, not correctly rounded)"
    if AMD_LEGACY_MAD.match(op) and not (op.startswith("v_mac_f32") and int_division_mac(instrs, i)):
        return "non-IEEE multiply-add (legacy mad/mac: flushes, rounds the product)"
    if AMD_FLOAT_ATOMIC.match(op):
        return "float atomic (order depends on timing)"
    if op in {"s_denorm_mode", "s_round_mode"} or (op.startswith("s_setreg") and "HW_REG_MODE" in code):
        return "changes the float mode register"
    return None


def amd_descriptors(text: str):
    """Each kernel descriptor's float mode fields that must hold RNE + denormals."""
    want = {".amdhsa_float_denorm_mode_32": "3", ".amdhsa_float_denorm_mode_16_64": "3",
            ".amdhsa_float_round_mode_32": "0", ".amdhsa_float_round_mode_16_64": "0"}
    kernel = None
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == [".amdhsa_kernel"]:
            kernel = parts[1]
        elif parts[:1] == [".end_amdhsa_kernel"]:
            kernel = None
        elif kernel and len(parts) == 2 and parts[0] in want and parts[1] != want[parts[0]]:
            what = "denormals flushed" if "denorm" in parts[0] else "rounding not to nearest even"
            yield Finding(kernel, "kernel descriptor", line.strip(), f"{what} (want {parts[0]} {want[parts[0]]})")


IR_FLAGGED = re.compile(r"\b(fadd|fsub|fmul|fdiv|frem|fneg|call|fcmp|select|phi)\s+((?:(?:fast|contract|reassoc|afn|arcp|nnan|ninf|nsz)\s+)+)")
IR_ATOMIC = re.compile(r"\batomicrmw\s+(?:volatile\s+)?(fadd|fsub|fmax|fmin)\b")


def ir_locations(text: str):
    """!dbg id -> 'file:line', following inlinedAt to the outermost call site."""
    locs, scopes, files = {}, {}, {}
    for line in text.splitlines():
        m = re.match(r"^!(\d+) = (?:distinct )?!(\w+)\((.*)\)$", line)
        if not m:
            continue
        ident, kind, body = m.groups()
        field = lambda k: (re.search(rf"\b{k}: (!?\w+|\"[^\"]*\")", body) or [None, None])[1]
        if kind == "DILocation":
            locs[ident] = (field("line"), (field("scope") or "!").lstrip("!"), (field("inlinedAt") or "!").lstrip("!"))
        elif kind == "DIFile":
            files[ident] = field("filename").strip('"')
        elif "file" in body:
            scopes[ident] = ((field("file") or "!").lstrip("!"), (field("scope") or "!").lstrip("!"))

    def file_of(scope):
        for _ in range(50):
            if scope in files:
                return files[scope]
            if scope not in scopes:
                return "?"
            f, up = scopes[scope]
            if f in files:
                return files[f]
            scope = up
        return "?"

    def resolve(ident):
        chain = []
        while ident in locs and len(chain) < 50:
            line, scope, inl = locs[ident]
            chain.append(f"{rel(file_of(scope))}:{line}")
            ident = inl
        return chain[0] + (f" (inlined at {chain[-1]})" if len(chain) > 1 else "") if chain else ""

    return resolve


def lint_ir(text: str):
    resolve = ir_locations(text)
    func = "(module)"
    for line in text.splitlines():
        m = re.match(r"^define .*@([\w.$]+)\(", line)
        if m:
            func = m.group(1)
            continue
        dbg = re.search(r"!dbg !(\d+)", line)
        where = resolve(dbg.group(1)) if dbg else ""
        m = IR_ATOMIC.search(line)
        if m:
            yield Finding(func, where, line.strip().split(", !dbg")[0], f"float atomic ({m.group(1)})")
        m = IR_FLAGGED.search(line)
        if m:
            yield Finding(func, where, line.strip().split(", !dbg")[0],
                          f"fast-math flags '{m.group(2).strip()}' (built without -ffp-contract=off / with fast math)")
        if "@llvm.fmuladd" in line and line.lstrip().startswith(("%", "call", "tail")):
            yield Finding(func, where, line.strip().split(", !dbg")[0], "llvm.fmuladd: contraction allowed")


def lint_gfx90a(compiler, src, flags, tmp):
    base = [compiler, *flags, "--cuda-device-only", "-gline-tables-only", "-Wno-unused-command-line-argument"]
    asm, ll = os.path.join(tmp, "dev.s"), os.path.join(tmp, "dev.ll")
    compile_to([*base, "-S", src, "-o", asm], "hipcc device asm")
    compile_to([*base, "-S", "-emit-llvm", src, "-o", ll], "hipcc device IR")
    text = pathlib.Path(asm).read_text()
    if not re.search(r"amdgcn-amd-amdhsa--gfx90a|\.amdgcn_target\s+\"amdgcn-amd-amdhsa--gfx90a", text):
        sys.stderr.write("gpu-lint: the device asm is not for gfx90a (pass --offload-arch=gfx90a)\n")
        sys.exit(2)
    instrs = amd_scan(text)
    findings = [Finding(f, w, c, r) for i, (f, w, c) in enumerate(instrs) if (r := amd_reason(instrs, i))]
    findings += amd_descriptors(text)
    findings += lint_ir(pathlib.Path(ll).read_text())
    return findings


# --- driver ---------------------------------------------------------------------


def planted_directives(src: str, check: str):
    text = pathlib.Path(src).read_text()
    get = lambda key: [m.strip() for m in re.findall(rf"//\s*LINT-{key}\({check}\):\s*(.+)$", text, flags=re.M)]
    return get("EXPECT"), get("DROP-FLAG"), get("ADD-FLAG")


def report(src, check, findings):
    names = demangle(f.function for f in findings)
    lines = []
    for f in findings:
        lines.append(f"{rel(src)}: {check}: {names.get(f.function, f.function)}: {f.where or '?'}: {f.text}\n"
                     f"    -> {f.reason}")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("check", choices=["ptx", "gfx90a"])
    ap.add_argument("--compiler", required=True)
    ap.add_argument("--planted", action="store_true", help="FILE is a bad source the lint must reject")
    ap.add_argument("source")
    ap.add_argument("flags", nargs=argparse.REMAINDER)
    args = ap.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    expect = []
    if args.planted:
        expect, drop, add = planted_directives(args.source, args.check)
        if not expect:
            sys.exit(f"gpu-lint: {args.source} has no // LINT-EXPECT({args.check}): lines")
        flags = [f for f in flags if f not in drop] + add
    with tempfile.TemporaryDirectory(prefix="gpu-lint-") as tmp:
        run = lint_ptx if args.check == "ptx" else lint_gfx90a
        findings = run(args.compiler, args.source, flags, tmp)
    text = report(args.source, args.check, findings)
    if not args.planted:
        if findings:
            print(text)
            print(f"gpu-lint: {rel(args.source)}: {len(findings)} finding(s) in the {args.check} check")
            return 1
        print(f"gpu-lint: {rel(args.source)}: {args.check} clean")
        return 0
    print(text or f"gpu-lint: {rel(args.source)}: no findings")
    missing = [e for e in expect if not re.search(e, text)]
    if missing:
        print(f"gpu-lint: planted {rel(args.source)} was not rejected as expected; missing: {missing}")
        return 1
    print(f"gpu-lint: planted {rel(args.source)} rejected as expected ({len(findings)} finding(s))")
    return 0


if __name__ == "__main__":
    sys.exit(main())
