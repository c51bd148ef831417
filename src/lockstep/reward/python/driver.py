# The worker of lockstep's Python pool (reward/python_pool.h). It is embedded
# into the lockstep binary at build time and run as `python3 -c SOURCE FILE
# FUNCTION...`: it imports the user's FILE once, describes the named
# functions, then answers one JSON request per line on fd 3 (a socket) until
# the socket closes. The user's stdout is the process's stderr (the parent
# folds fd 1 into fd 2), so print() never reaches the protocol.
#
# Messages (one JSON object per line):
#   worker -> lockstep, once: {"ready": {"python": "3.11.2", "functions": {NAME: INFO}}}
#                         or: {"fatal": "FILE:LINE: what went wrong", "traceback": "..."}
#   lockstep -> worker: {"id": N, "fn": NAME, "kwargs": {...}}
#                       {"id": N, "fn": NAME, "kwargs": {...}, "keep": true}: NAME(**kwargs) is kept in
#                           this worker; the result is its handle (an int)
#                       {"id": N, "obj": H, "fn": METHOD, "kwargs": {...}}: a method of kept object H
#                       {"id": N, "obj": H, "drop": true}: forget H (result null)
#   worker -> lockstep: {"id": N, "result": JSON} | {"id": N, "error": "Type: message", "traceback": "..."}
#                       | {"id": N, "unconvertible": "TYPE"} (a value JSON cannot hold: NaN, an object)
# INFO: {"file": basename, "line": N, "async": bool, "return_kinds": null | ["number", "dict", "none", "other"]}
import asyncio
import importlib.util
import inspect
import json
import math
import os
import socket
import sys
import traceback
import typing


def send(wfile, obj):
    wfile.write(json.dumps(obj, allow_nan=False).encode() + b"\n")
    wfile.flush()


def user_traceback(exc):
    """The traceback without the driver's own frames and importlib's."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith("<"):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb))


def where_in_file(exc, path):
    """FILE:LINE of the deepest frame of the user's file in the traceback."""
    line = None
    for frame, lineno in traceback.walk_tb(exc.__traceback__):
        if os.path.abspath(frame.f_code.co_filename) == os.path.abspath(path):
            line = lineno
    return f"{os.path.basename(path)}:{line}" if line else os.path.basename(path)


def import_file(path):
    directory = os.path.dirname(os.path.abspath(path))
    if directory not in sys.path:
        sys.path.insert(0, directory)  # the file may import its neighbours
    name = os.path.splitext(os.path.basename(path))[0] or "custom_module"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def annotation_kinds(fn):
    """What the return annotation allows, as kinds; None without one."""
    try:
        hints = typing.get_type_hints(fn)
        if "return" not in hints:
            return None
        ann = hints["return"]
    except Exception:
        ann = getattr(fn, "__annotations__", {}).get("return", inspect.Signature.empty)
        if ann is inspect.Signature.empty:
            return None
    return sorted(set(kinds_of(ann)))


def kinds_of(ann):
    if isinstance(ann, str):  # an annotation get_type_hints could not resolve
        low = ann.replace("typing.", "").strip()
        for word, kind in (("float", "number"), ("int", "number"), ("bool", "number"), ("Number", "number"),
                           ("dict", "dict"), ("Dict", "dict"), ("Mapping", "dict"), ("Any", "number")):
            if word in low:
                return [kind]
        return ["none"] if low == "None" else ["other"]
    if ann is None or ann is type(None):
        return ["none"]
    if ann is typing.Any:
        return ["number", "dict"]
    origin = typing.get_origin(ann)
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        return [k for a in typing.get_args(ann) for k in kinds_of(a)]
    if origin is not None:
        ann = origin
    if isinstance(ann, type):
        import collections.abc
        import numbers
        if issubclass(ann, (int, float, numbers.Number)):
            return ["number"]
        if issubclass(ann, (dict, collections.abc.Mapping)):
            return ["dict"]
    return ["other"]


def describe(module, path, names):
    infos = {}
    base = os.path.basename(path)
    for name in names:
        if not hasattr(module, name):
            defined = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                             and getattr(v, "__module__", None) == module.__name__)
            return None, f"{base}: no function '{name}' (functions defined there: {', '.join(defined) or 'none'})"
        fn = getattr(module, name)
        if not callable(fn):
            return None, f"{base}: '{name}' is a {type(fn).__name__}, not a function"
        target = fn if inspect.isfunction(fn) or inspect.ismethod(fn) else getattr(type(fn), "__call__", fn)
        code = getattr(inspect.unwrap(target), "__code__", None)
        line = code.co_firstlineno if code else 0
        if inspect.isclass(fn):  # an environment class: where the class statement is
            try:
                line = inspect.getsourcelines(fn)[1]
            except (OSError, TypeError):
                line = 0
        infos[name] = {
            "file": os.path.basename(code.co_filename) if code else base,
            "line": line,
            "async": inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(target),
            "return_kinds": annotation_kinds(target),
        }
    return infos, None


def to_json_value(obj):
    """Numpy scalars and arrays, and other number-likes, as plain JSON."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "__float__") and not isinstance(obj, (str, bytes)):
        return float(obj)
    raise TypeError(type(obj).__name__)


def is_finite_tree(v):
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, dict):
        return all(is_finite_tree(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(is_finite_tree(x) for x in v)
    return True


def answer(module, loop, req, kept):
    rid = req.get("id")
    try:
        if "obj" in req:
            if req["obj"] not in kept:
                raise KeyError(f"no object {req['obj']} in this worker")
            if req.get("drop"):
                del kept[req["obj"]]
                return {"id": rid, "result": None}
            fn = getattr(kept[req["obj"]], req["fn"])
        else:
            fn = getattr(module, req["fn"])
        result = fn(**req.get("kwargs", {}))
        if inspect.isawaitable(result):
            result = loop.run_until_complete(result)
        if req.get("keep"):
            kept[rid] = result
            return {"id": rid, "result": rid}
    except Exception as exc:  # the user's error, reported per call
        return {"id": rid, "error": f"{type(exc).__name__}: {exc}", "traceback": user_traceback(exc)}
    try:
        text = json.dumps(result, allow_nan=False, default=to_json_value)
        return {"id": rid, "result": json.loads(text)}
    except (TypeError, ValueError):
        if isinstance(result, float) or not is_finite_tree(result):
            return {"id": rid, "unconvertible": repr(result)[:100]}
        return {"id": rid, "unconvertible": type(result).__name__}


def main():
    path, names = sys.argv[1], sys.argv[2:]
    sys.argv = [path]
    sock = socket.socket(fileno=3)
    rfile, wfile = sock.makefile("rb"), sock.makefile("wb")
    sys.stdout.reconfigure(line_buffering=True)
    if not os.path.isfile(path):
        send(wfile, {"fatal": f"{path}: no such file"})
        return
    try:
        module = import_file(path)
    except SyntaxError as exc:
        where = f"{os.path.basename(exc.filename or path)}:{exc.lineno}"
        send(wfile, {"fatal": f"{where}: SyntaxError: {exc.msg}", "traceback": user_traceback(exc)})
        return
    except BaseException as exc:  # noqa: B036 - an import may sys.exit()
        send(wfile, {"fatal": f"{where_in_file(exc, path)}: {type(exc).__name__}: {exc}",
                     "traceback": user_traceback(exc)})
        return
    infos, problem = describe(module, path, names)
    if problem:
        send(wfile, {"fatal": problem})
        return
    send(wfile, {"ready": {"python": sys.version.split()[0], "pid": os.getpid(), "functions": infos}})
    loop = asyncio.new_event_loop()  # one per worker: async functions are awaited on it
    asyncio.set_event_loop(loop)
    kept = {}  # handle -> object (instances made with "keep")
    for line in rfile:
        send(wfile, answer(module, loop, json.loads(line), kept))


main()
