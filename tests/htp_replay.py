"""Record and replay of the HTP graph rewrites (issue 24: one way to rewrite graphs).

Recording wraps the functions that rewrote graphs for QNN HTP before they became rules and
saves, per call, the input (model bytes, other arguments) and the output (model bytes after,
return value) under $WINML_HTP_RECORD. It also keeps the sha256 of every quantized model
`quantize_static_qdq` wrote (the end-to-end result). Install it in every process of a test
run with a sitecustomize that calls `install()`:

    echo 'import tests.htp_replay as r; r.install()' > SITE/sitecustomize.py
    WINML_HTP_RECORD=/tmp/rec PYTHONPATH=$PWD:SITE pytest ...

Replay (`python -m tests.htp_replay /tmp/rec`) runs today's code on every recorded input and
says which outputs are not byte-identical.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import pickle
import sys
from pathlib import Path
from typing import Any

_counter = itertools.count()

# module -> functions that rewrite a graph (or compute ranges from one) for HTP
RECORDED = {
    "winml_recipes.eps.qnn.rules.encodings": [
        "widen_softmax_inputs", "widen_add_outputs", "shared_encoding_groups", "unify_ranges",
    ],
    "winml_recipes.eps.qnn.rules": ["fold_nan_guards"],
    "winml_recipes.quant.calibrate": ["replace_unseen_sentinels"],
}  # fmt: skip

# Where the functions of a recording made before the rules (quant/qnn_rules.py) live now.
# The float rewrites (simplify_for_htp, drop_zero_constant_adds) are the prepare pass's
# `htp` stage: tests/htp_replay_float.py replays them; mixed._toposort is onnx_ir's
# TopologicalSortPass (an order of the scoring session's nodes, not part of any output).
MOVED = {
    "winml_recipes.quant.qnn_rules.fold_nan_guards": "winml_recipes.eps.qnn.rules",
    "winml_recipes.quant.qnn_rules": "winml_recipes.eps.qnn.rules.encodings",
}
NOT_REPLAYED = ("simplify_for_htp", "drop_zero_constant_adds", "_toposort")


def _freeze(value: Any) -> Any:
    import onnx

    if isinstance(value, onnx.ModelProto | onnx.GraphProto):
        return ("proto", type(value).__name__, value.SerializeToString(deterministic=True))
    if isinstance(value, dict):
        return {k: _freeze(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_freeze(v) for v in value)
    return value


def _wrap(module: Any, name: str, root: Path) -> None:
    original = getattr(module, name)

    def recorded(*args: Any, **kwargs: Any) -> Any:
        before = _freeze((args, kwargs))
        result = original(*args, **kwargs)
        record = {
            "function": f"{module.__name__}.{name}",
            "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
            "args": before,
            "args_after": _freeze((args, kwargs)),
            "result": _freeze(result),
        }
        path = root / f"{os.getpid()}-{next(_counter):05d}-{name}.pkl"
        path.write_bytes(pickle.dumps(record))
        return result

    setattr(module, name, recorded)


def _wrap_quantize(root: Path) -> None:
    import winml_recipes.quant.ort as ort

    original = ort.quantize_static_qdq

    def recorded(src, out, *args, **kwargs):
        result = original(src, out, *args, **kwargs)
        test = os.environ.get("PYTEST_CURRENT_TEST", "")
        digest = hashlib.sha256(Path(out).read_bytes()).hexdigest()
        with (root / "quantized.tsv").open("a") as f:
            f.write(f"{test}\t{Path(out).parent.name}\t{digest}\n")
        return result

    ort.quantize_static_qdq = recorded


def install() -> None:
    """Wrap the recorded functions when $WINML_HTP_RECORD names a directory."""
    target = os.environ.get("WINML_HTP_RECORD")
    if not target:
        return
    import importlib

    root = Path(target)
    root.mkdir(parents=True, exist_ok=True)
    for module_name, names in RECORDED.items():
        module = importlib.import_module(module_name)
        for name in names:
            _wrap(module, name, root)
    _wrap_quantize(root)


def _thaw(value: Any) -> Any:
    import onnx

    if isinstance(value, tuple) and len(value) == 3 and value[0] == "proto":
        proto = onnx.ModelProto() if value[1] == "ModelProto" else onnx.GraphProto()
        proto.ParseFromString(value[2])
        return proto
    if isinstance(value, dict):
        return {k: _thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_thaw(v) for v in value)
    return value


def replay(root: Path, call: Any = None) -> list[str]:
    """Run each recorded call again (with `call(function, args, kwargs)` when given) and
    return one line per call whose mutated arguments or result are not identical."""
    import importlib

    problems = []
    for path in sorted(root.glob("*.pkl")):
        record = pickle.loads(path.read_bytes())
        args, kwargs = _thaw(record["args"])
        if call is None:
            module_name, name = record["function"].rsplit(".", 1)
            if name in NOT_REPLAYED:
                continue
            module_name = MOVED.get(record["function"], MOVED.get(module_name, module_name))
            result = getattr(importlib.import_module(module_name), name)(*args, **kwargs)
            if record["function"] == "winml_recipes.quant.qnn_rules.fold_nan_guards":
                # the old function returned how many Wheres it removed
                result = len(result)
        else:
            result = call(record["function"], args, kwargs)
        if _freeze((args, kwargs)) != record["args_after"]:
            problems.append(f"{path.name}: model differs ({record['test']})")
        elif _freeze(result) != record["result"]:
            problems.append(
                f"{path.name}: result differs ({record['test']}): "
                f"{record['result']!r:.200} -> {_freeze(result)!r:.200}"
            )
    return problems


if __name__ == "__main__":
    found = replay(Path(sys.argv[1]))
    print("\n".join(found) or "every recorded call is byte-identical")
    sys.exit(1 if found else 0)
