"""SAM 3 vision pieces at the full widths, exported by torch's dynamo exporter with seeded
random weights: one ViT block (global or windowed attention) or sam3-mid's vision encoder
(2 ViT layers and the neck), at any image side (tokens = (side / 14)^2), with static shapes;
or ("mid") sam3-mid's vision encoder as this tool's exporter writes it (1008 px, batch
dynamic: the build's fix_shapes makes it 1).

Used by bench/htp_prepare_memory.py and tests/integration/test_chunked_attention_htp.py.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PATCH = 14
HIDDEN, HEADS, MLP = 1024, 16, 4736  # Sam3ViTConfig's defaults (the published model's)
PARTS = ("global", "window", "encoder2", "mid")

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


def export_block(side: int, part: str, out: Path) -> Path:
    """`part` ("global", "window" or "encoder2") at `side` px, written to `out`."""
    if part not in PARTS:
        raise ValueError(f"part {part!r}: one of {', '.join(PARTS)}")
    code = _EXPORT.format(hidden=HIDDEN, heads=HEADS, mlp=MLP, patch=PATCH)
    if part == "mid":
        code = _MID
    done = subprocess.run([sys.executable, "-c", code, str(side), part, str(out)], cwd=REPO,
                          capture_output=True, text=True)  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"export of {part} at {side} px failed: {done.stderr[-800:]}")
    return out
