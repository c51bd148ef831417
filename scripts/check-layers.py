#!/usr/bin/env python3
"""Checks the layer order of src/lockstep/: a module may include only itself and
modules listed before it in CMakeLists.txt's lockstep_module(...) calls.

Usage: check-layers.py [REPO_ROOT]. Exits 1 and prints every offending
'#include "lockstep/<module>/..."' with its file and line; exits 0 otherwise.
The order itself is documented in docs/architecture.md.
"""
import pathlib
import re
import sys


def layer_order(root: pathlib.Path) -> list[str]:
    text = (root / "CMakeLists.txt").read_text()
    order = re.findall(r"^lockstep_module\((\w+)", text, flags=re.M)
    if not order:
        sys.exit(f"{root / 'CMakeLists.txt'}: no lockstep_module(...) calls found")
    # cli/ is the executable, not a module: it sits above everything.
    return order + ["cli"]


def violations(root: pathlib.Path, order: list[str]) -> list[str]:
    rank = {m: i for i, m in enumerate(order)}
    src = root / "src" / "lockstep"
    include = re.compile(r'^\s*#\s*include\s+"lockstep/(\w+)/')
    found = []
    for path in sorted(src.rglob("*")):
        if path.suffix not in (".h", ".cpp", ".cu", ".cuh", ".inc"):
            continue
        module = path.relative_to(src).parts[0]
        if module not in rank:
            found.append(f"{path}: folder '{module}' is not a module in CMakeLists.txt")
            continue
        for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            m = include.match(line)
            if not m:
                continue
            dep = m.group(1)
            if dep not in rank:
                found.append(f"{path}:{lineno}: includes unknown module '{dep}'")
            elif rank[dep] > rank[module]:
                found.append(f"{path}:{lineno}: module '{module}' includes '{dep}', which is above it")
    return found


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    order = layer_order(root)
    bad = violations(root, order)
    for b in bad:
        print(b)
    if bad:
        print(f"{len(bad)} include(s) break the layer order: {' < '.join(order)}")
        return 1
    print(f"layer order holds: {' < '.join(order)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
