"""SAM 3 vision pieces at the full widths, exported by torch's dynamo exporter with seeded
random weights: one ViT block (global or windowed attention) or sam3-mid's vision encoder
(2 ViT layers and the neck), at any image side (tokens = (side / 14)^2), with static shapes;
or ("mid") sam3-mid's vision encoder as this tool's exporter writes it (1008 px, batch
dynamic: the build's fix_shapes makes it 1).

Used by experiments/htp_prepare_memory.py and tests/integration/test_chunked_attention_htp.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATCH = 14
HIDDEN, HEADS, MLP = 1024, 16, 4736  # Sam3ViTConfig's defaults (the published model's)
PARTS = ("global", "window", "encoder2", "mid", "mlp4d", "mlp2d", "rotary")

# In a child process: torch's peak stays out of the caller's.
_EXPORT = """
import sys, torch
from transformers.models.sam3.configuration_sam3 import Sam3ViTConfig
from transformers.models.sam3.modeling_sam3 import Sam3ViTLayer
side, part, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
torch.manual_seed(0)
if part == "encoder2":  # sam3-mid's vision encoder (2 ViT layers, neck)
    from transformers import Sam3TrackerConfig, Sam3TrackerModel
    g = side // {patch}
    cfg = Sam3TrackerConfig(vision_config={{"model_type": "sam3_vision_model",
        "backbone_config": {{"model_type": "sam3_vit_model", "num_hidden_layers": 2,
                            "global_attn_indexes": [1], "image_size": side}},
        "backbone_feature_sizes": [[4 * g, 4 * g], [2 * g, 2 * g], [g, g]]}})
    inner = Sam3TrackerModel(cfg).eval()
    class Encoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = inner
        def forward(self, pixel_values):
            return tuple(self.inner.get_image_embeddings(pixel_values))
    module, x, names = Encoder(), torch.rand(1, 3, side, side) * 2 - 1, ["pixel_values"]
else:
    cfg = Sam3ViTConfig(image_size=side, hidden_size={hidden}, num_attention_heads={heads},
                        intermediate_size={mlp})
    cfg._attn_implementation = "sdpa"  # what Sam3TrackerModel uses by default
    module = Sam3ViTLayer(cfg, window_size=0 if part == "global" else cfg.window_size).eval()
    g = side // {patch}
    x, names = torch.randn(1, g, g, {hidden}), ["hidden_states"]
with torch.no_grad():
    torch.onnx.export(module, (x,), out, dynamo=True, input_names=names, optimize=True)
"""

_MID = """
import sys, onnx
from winml_recipes.catalog import load_entry
from winml_recipes.exporters import ExportRequest, export_model
out = sys.argv[3]
config = load_entry("sam3-mid").components["vision_encoder"].source["config"]
model = export_model(ExportRequest("sam3_tracker", "vision_encoder", config=dict(config)))
onnx.save(model, out, save_as_external_data=True, location=out.rsplit("/", 1)[-1] + ".data")
"""


def mlp(side: int, out: Path, rank4: bool) -> Path:
    """A ViT block's MLP (x @ W1 + b1 -> Gelu -> @ W2 + b2) on the (side/14)^2 tokens:
    as this tool's export writes it (x [1, g, g, 1024], rank-4 MatMuls with 2-D weights) or
    on the tokens flattened ([g*g, 1024], what ORT's normalize makes of a static trace)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    g = side // PATCH
    # batch dynamic, as the tool's exporter leaves it: onnxruntime's normalize then keeps
    # the rank-4 MatMuls (with static shapes it fuses them into Reshape -> Gemm -> Reshape)
    shape = ["batch", g, g, HIDDEN] if rank4 else [g * g, HIDDEN]
    rng = np.random.default_rng(0)

    def w(name: str, *dims: int) -> onnx.TensorProto:
        return numpy_helper.from_array(rng.normal(0, 0.02, dims).astype(np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h0"]),
        helper.make_node("Add", ["h0", "b1"], ["h1"]),
        helper.make_node("Gelu", ["h1"], ["h2"]),
        helper.make_node("MatMul", ["h2", "w2"], ["h3"]),
        helper.make_node("Add", ["h3", "b2"], ["y"]),
    ]
    inits = [w("w1", HIDDEN, MLP), w("b1", MLP), w("w2", MLP, HIDDEN), w("b2", HIDDEN)]
    return _save("mlp", nodes, inits, shape, out)


def rotary(side: int, out: Path) -> Path:
    """The global layer's 2-D rotary embedding on q as torch's dynamo exporter writes it
    (`x * cos + rotate_pairwise(x) * sin`; rotate_pairwise: Reshape to [.., 32, 2], Slice
    and Squeeze each half, Neg, Unsqueeze both, Concat on the new last axis, Reshape back),
    on x [1, 16, (side/14)^2, 64], with seeded cos/sin tables."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    n, half = (side // PATCH) ** 2, HIDDEN // HEADS // 2
    rng = np.random.default_rng(0)
    angles = rng.uniform(0, 2 * np.pi, (n, half)).repeat(2, axis=-1)

    def c(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value), name)

    inits = [
        c("cos", np.cos(angles).astype(np.float32)), c("sin", np.sin(angles).astype(np.float32)),
        c("pairs", np.array([-1, HEADS, n, half, 2], np.int64)),
        c("back", np.array([-1, HEADS, n, 2 * half], np.int64)),
        *(c(k, np.array([v], np.int64)) for k, v in (("i0", 0), ("i1", 1), ("i2", 2))),
        c("last", np.array([-1], np.int64)),
    ]  # fmt: skip
    nodes = [
        helper.make_node("Reshape", ["x", "pairs"], ["view"], allowzero=1),
        helper.make_node("Slice", ["view", "i0", "i1", "last"], ["s0"]),
        helper.make_node("Slice", ["view", "i1", "i2", "last"], ["s1"]),
        helper.make_node("Squeeze", ["s0", "last"], ["x1"]),
        helper.make_node("Squeeze", ["s1", "last"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["neg"]),
        helper.make_node("Unsqueeze", ["neg", "last"], ["u0"]),
        helper.make_node("Unsqueeze", ["x1", "last"], ["u1"]),
        helper.make_node("Concat", ["u0", "u1"], ["stack"], axis=-1),
        helper.make_node("Reshape", ["stack", "back"], ["rotated"], allowzero=1),
        helper.make_node("Mul", ["x", "cos"], ["xc"]),
        helper.make_node("Mul", ["rotated", "sin"], ["rs"]),
        helper.make_node("Add", ["xc", "rs"], ["y"]),
    ]
    return _save("rotary", nodes, inits, [1, HEADS, n, 2 * half], out)


def _save(name: str, nodes: list, inits: list, shape: list, out: Path) -> Path:
    """A one-input (x), one-output (y) float graph of `shape`, opset 20, written to `out`."""
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits,
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=10)
    onnx.save(model, out)
    return out


def export_block(side: int, part: str, out: Path) -> Path:
    """`part` (one of PARTS) at `side` px, written to `out`."""
    if part not in PARTS:
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    if part in ("mlp4d", "mlp2d"):
        return mlp(side, out, part == "mlp4d")
    if part == "rotary":
        return rotary(side, out)
    code = _EXPORT.format(hidden=HIDDEN, heads=HEADS, mlp=MLP, patch=PATCH)
    if part == "mid":
        code = _MID
    done = subprocess.run([sys.executable, "-c", code, str(side), part, str(out)], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"export of {part} at {side} px failed: {done.stderr[-800:]}")
    return out
