#!/usr/bin/env python3
"""clang-format and clang-tidy checks that fail on new violations only.

The code base predates its lint rules, so a plain "no warnings" gate would fail
on thousands of old lines. Instead scripts/lint-baseline.json records, for every
C++ file, its SHA-256 and how many violations it had when the baseline was
taken:

  format  clang-format replacements (.clang-format), for every .h/.cpp/.cu/.cuh
          under src/, tests/ and bench/;
  tidy    clang-tidy warnings (.clang-tidy) located in the file itself, for
          every .cpp under src/ (headers are seen through the .cpp files that
          include them, but their warnings are not counted).

`lint.py check` re-examines only the files whose content differs from the
baseline (and new files): one fails if it has more violations than the
baseline allows (0 for a new file), and its violations are printed. Files that
lost violations are listed so the baseline can be tightened. `lint.py update`
re-examines every file and rewrites the baseline (do this after fixing old
violations, never to hide new ones).

Usage: lint.py check|update [--build DIR] [--jobs N]
  --build DIR  the build directory with compile_commands.json (build/release)
  --jobs N     parallel clang-tidy processes (2)
Exit status: 0 clean, 1 new violations, 2 a tool or input is missing.
"""
import argparse
import concurrent.futures
import hashlib
import json
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scripts" / "lint-baseline.json"
FORMAT_DIRS = ("src", "tests", "bench")
FORMAT_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
# The GCC-only warning flags of the build, unknown to clang: ignored, not errors.
TIDY_EXTRA = ["--extra-arg=-Wno-unknown-warning-option", "--quiet"]


def tool(names):
    for n in names:
        if shutil.which(n):
            return n
    sys.stderr.write(f"lint: none of {', '.join(names)} is installed (scripts/install-deps.sh installs them)\n")
    sys.exit(2)


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def format_files():
    out = []
    for d in FORMAT_DIRS:
        for p in sorted((ROOT / d).rglob("*")):
            # Not node_modules: npm packages the tests install (some carry C sources).
            if "node_modules" in p.parts:
                continue
            if p.suffix in FORMAT_SUFFIXES and p.is_file() and "/lint/" not in str(p):
                out.append(p)
    return out


def tidy_files():
    return [p for p in sorted((ROOT / "src").rglob("*.cpp")) if p.is_file()]


def format_violations(clang_format, path):
    """The lines clang-format would change, as 'file:line: clang-format' strings."""
    xml = subprocess.run([clang_format, "--style=file", "--output-replacements-xml", str(path)],
                         capture_output=True, text=True, check=True).stdout
    text = path.read_bytes()
    out = []
    for m in re.finditer(r"<replacement offset='(\d+)'", xml):
        line = text[: int(m.group(1))].count(b"\n") + 1
        out.append(f"{path.relative_to(ROOT)}:{line}: clang-format would change this line")
    return out


def tidy_violations(clang_tidy, build, path):
    """clang-tidy's warnings located in `path` itself."""
    r = subprocess.run([clang_tidy, "-p", str(build), *TIDY_EXTRA, str(path)], capture_output=True, text=True)
    prefix = str(path) + ":"
    out = []
    for line in r.stdout.splitlines():
        if line.startswith(prefix) and " warning: " in line:
            out.append(str(path.relative_to(ROOT)) + line[len(str(path)):])
    return out


def examine(paths_format, paths_tidy, build, jobs):
    clang_format = tool(["clang-format-14", "clang-format"])
    clang_tidy = tool(["clang-tidy-14", "clang-tidy"]) if paths_tidy else None
    if paths_tidy and not (build / "compile_commands.json").is_file():
        sys.stderr.write(f"lint: {build / 'compile_commands.json'} is missing (configure the build first)\n")
        sys.exit(2)
    found = {}
    for p in paths_format:
        found.setdefault(p, {})["format"] = format_violations(clang_format, p)
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        for p, v in zip(paths_tidy, pool.map(lambda q: tidy_violations(clang_tidy, build, q), paths_tidy)):
            found.setdefault(p, {})["tidy"] = v
    return found


def load_baseline():
    if not BASELINE.is_file():
        return {}
    try:
        return json.loads(BASELINE.read_text())["files"]
    except (ValueError, KeyError) as e:
        sys.stderr.write(f"lint: {BASELINE}: not a lint baseline ({e}); run `lint.py update`\n")
        sys.exit(2)


def update(build, jobs):
    found = examine(format_files(), tidy_files(), build, jobs)
    files = {}
    for p, v in sorted(found.items()):
        files[str(p.relative_to(ROOT))] = {"sha256": sha(p), **{k: len(x) for k, x in v.items()}}
    BASELINE.write_text(json.dumps({"files": files}, indent=1, sort_keys=True) + "\n")
    total = {k: sum(f.get(k, 0) for f in files.values()) for k in ("format", "tidy")}
    print(f"lint: baseline of {len(files)} files written: {total['format']} clang-format and "
          f"{total['tidy']} clang-tidy violations allowed")
    return 0


def check(build, jobs):
    base = load_baseline()
    changed = lambda p: base.get(str(p.relative_to(ROOT)), {}).get("sha256") != sha(p)
    fmt = [p for p in format_files() if changed(p)]
    tidy = [p for p in tidy_files() if changed(p)]
    found = examine(fmt, tidy, build, jobs)
    failed, improved = [], []
    for p, v in sorted(found.items()):
        allowed = base.get(str(p.relative_to(ROOT)), {})
        for kind, lines in v.items():
            limit = allowed.get(kind, 0)
            if len(lines) > limit:
                failed.append((p, kind, limit, lines))
            elif len(lines) < limit:
                improved.append(f"{p.relative_to(ROOT)}: {kind} {limit} -> {len(lines)}")
    for p, kind, limit, lines in failed:
        print(f"lint: {p.relative_to(ROOT)}: {len(lines)} {kind} violations, the baseline allows {limit}:")
        for line in lines:
            print("  " + line)
    if improved:
        print("lint: fewer violations than the baseline (tighten it with `scripts/lint.py update`): "
              + "; ".join(improved))
    print(f"lint: {len(found)} changed or new files examined ({len(fmt)} formatted, {len(tidy)} tidied), "
          f"{len(failed)} with new violations")
    if failed:
        print("lint: fix them (clang-format -i FILE formats a whole file; a changed line of an old file is "
              "best formatted by hand), or, for a deliberate exception, `// NOLINT(check)` on the line")
    return 1 if failed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=["check", "update"])
    ap.add_argument("--build", default=str(ROOT / "build" / "release"))
    ap.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args()
    build = pathlib.Path(a.build).resolve()
    return update(build, a.jobs) if a.mode == "update" else check(build, a.jobs)


if __name__ == "__main__":
    sys.exit(main())
