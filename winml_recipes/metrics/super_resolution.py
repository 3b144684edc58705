"""image-to-image (super-resolution): PSNR of the target's image against the float model's."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from winml_recipes.sdk.contract import IOContract
from winml_recipes.sdk.metrics import DefaultGate, Outputs, TaskMetric

MAX_PSNR_DB = 100.0  # identical images


def psnr_db(reference: np.ndarray, candidate: np.ndarray) -> float:
    """PSNR in dB of two images in [0, 1] (clamped there first, as the processors'
    post-processing does before writing pixels), peak 1."""
    ref = np.clip(np.asarray(reference, np.float64), 0.0, 1.0)
    cand = np.clip(np.asarray(candidate, np.float64), 0.0, 1.0)
    mse = float(np.mean((ref - cand) ** 2))
    return MAX_PSNR_DB if mse <= 10 ** (-MAX_PSNR_DB / 10) else -10.0 * np.log10(mse)


class ReconstructionPSNR(TaskMetric):
    """Per sample, PSNR of the target's upscaled image against the float model's (both
    clamped to [0, 1], peak 1): mean and worst."""

    name = "reconstruction-psnr"
    tasks = frozenset({"image-to-image", "super-resolution"})
    description = (
        "the output image clamped to [0, 1] as post-processing does: psnr_db against the "
        "float model's (peak 1), mean and _worst over samples"
    )
    gates = {"psnr_db_worst": DefaultGate(30.0)}

    def outputs_used(self, contract: IOContract) -> tuple[str, ...] | None:
        names = [s.name for s in contract.outputs]
        if "reconstruction" in names:
            return ("reconstruction",)
        images = [s.name for s in contract.outputs if len(s.shape) == 4]
        return (images[0],) if len(names) == 1 and images else None

    def values(
        self, reference: Sequence[Outputs], candidate: Sequence[Outputs]
    ) -> dict[str, float]:
        name = "reconstruction" if "reconstruction" in reference[0] else next(iter(reference[0]))
        psnr = [
            psnr_db(ref[name], cand[name]) for ref, cand in zip(reference, candidate, strict=True)
        ]
        return {
            "psnr_db": float(np.mean(psnr)),
            "psnr_db_worst": float(np.min(psnr)),
            "samples": float(len(psnr)),
        }
