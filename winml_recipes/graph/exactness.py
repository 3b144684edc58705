"""Whether a rewritten model computes what the original did, on the same inputs (CPU EP)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

# Float outputs may differ by ATOL + RTOL * |original| element-wise: a rewrite changes the
# order of float additions (an unrolled LSTM's MatMuls, a constant folded by numpy instead
# of onnxruntime), not the arithmetic; a wrong rewrite is off by orders of magnitude more.
# Measured: torch LSTM/GRU exports unrolled differ by at most 6e-8. Integer and bool
# outputs must be equal.
ATOL = 1e-5
RTOL = 1e-5


def first_difference(
    before: Sequence[Mapping[str, np.ndarray]], after: Sequence[Mapping[str, np.ndarray]]
) -> str | None:
    """Where `after` departs from `before` beyond the tolerance (None: nowhere)."""
    for i, (a_out, b_out) in enumerate(zip(before, after, strict=True)):
        for name, a in a_out.items():
            b = b_out.get(name)
            if b is None:
                return f"output '{name}' is missing"
            a, b = np.asarray(a), np.asarray(b)
            if a.shape != b.shape:
                return f"output '{name}' has shape {list(b.shape)}, was {list(a.shape)}"
            if a.dtype.kind != "f":
                if not np.array_equal(a, b):
                    return f"output '{name}' changed on sample {i} (values of type {a.dtype})"
                continue
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            same_nan = np.isnan(a64) == np.isnan(b64)
            diff = np.abs(np.nan_to_num(a64) - np.nan_to_num(b64))
            bad = (diff > ATOL + RTOL * np.abs(np.nan_to_num(a64))) | ~same_nan
            if bad.any():
                return (
                    f"output '{name}' differs by up to {float(diff.max()):.3g} on sample {i} "
                    f"(allowed {ATOL:g} + {RTOL:g}*|x|)"
                )
    return None
