"""Replay the recorded float HTP rewrites (simplify_for_htp, then drop_zero_constant_adds)
through the rule set (winml_recipes.eps.qnn.rules.float_rewrites) and list the models that
differ. Compared after one onnx_ir round trip of both sides without value_info (the round
trip itself writes inferred value_info and explicit empty fields).

Known difference (accepted): crepe-tiny's Pad nodes end with an empty optional input ('');
onnx_ir's RemoveUnusedNodesPass (which the prepare pass runs on every model it writes)
drops it. An omitted trailing optional input and an empty one are the same node in ONNX.

    PYTHONPATH=$PWD python -m tests.htp_replay_float /tmp/htp-record
"""

from __future__ import annotations

import collections
import pickle
import sys
from pathlib import Path

import onnx_ir as ir

from tests.htp_replay import _thaw
from winml_recipes.eps.qnn.rules import float_rewrites, rewrite


def _canon(model) -> bytes:
    proto = ir.to_proto(ir.from_proto(model))
    proto.graph.ClearField("value_info")
    return proto.SerializeToString(deterministic=True)


def main(root: Path) -> int:
    records = sorted(root.glob("*.pkl"))
    stats: collections.Counter = collections.Counter()
    for i, path in enumerate(records):
        if not path.name.endswith("simplify_for_htp.pkl"):
            continue
        record = pickle.loads(path.read_bytes())
        source = _thaw(record["args"])[0][0]
        expected = _thaw(record["args_after"])[0][0]
        after = records[i + 1] if i + 1 < len(records) else None
        pid = path.name.split("-")[0]
        if (
            after
            and after.name.endswith("drop_zero_constant_adds.pkl")
            and after.name.startswith(pid)
        ):
            expected = _thaw(pickle.loads(after.read_bytes())["args_after"])[0][0]
        model = ir.from_proto(source)
        log = rewrite(model, float_rewrites())
        same = _canon(ir.to_proto(model)) == _canon(expected)
        stats[same] += 1
        if not same:
            counts = {k: len(v) for k, v in log.nodes.items()}
            print("DIFF", path.name, record["test"].split("::")[-1], counts)
    print(f"identical {stats[True]}, different {stats[False]}")
    return 1 if stats[False] else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
