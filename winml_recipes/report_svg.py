"""Inline SVG line plots for the build report (no script, no external resource)."""

from __future__ import annotations

import html
import math
from collections.abc import Sequence

WIDTH, HEIGHT = 1000, 280
LEFT, RIGHT, TOP, BOTTOM = 52, 16, 28, 34
CAP_DB = 100.0  # identical tensors score the metric's cap (200 dB): drawn at the top


def _y_range(values: Sequence[float]) -> tuple[float, float]:
    finite = [min(v, CAP_DB) for v in values if math.isfinite(v)] or [0.0]
    low = math.floor(min(min(finite), 0.0) / 10) * 10
    high = math.ceil(max(max(finite), low + 10) / 10) * 10
    return low, high


FLAG = "#d0021b"


def layer_plot(
    title: str,
    series: Sequence[tuple[str, str, Sequence[float]]],
    where: str,
    flagged: Sequence[int] = (),
) -> str:
    """One polyline per (label, colour, dB values in graph order), on shared axes; the
    points at `flagged` (indices) of the first series marked in red, each with its value
    (layers where the target departs from the simulation)."""
    count = max(len(v) for _, _, v in series)
    low, high = _y_range([x for _, _, v in series for x in v])
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def xy(i: int, v: float) -> tuple[float, float]:
        x = LEFT + (plot_w * i / max(count - 1, 1))
        v = min(max(v if math.isfinite(v) else low, low), high)
        return x, TOP + plot_h * (high - v) / (high - low)

    parts = [
        f'<svg width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" class="layer-plot" '
        f'aria-label="per-layer SQNR of {html.escape(title)}">',
        f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="#fafafa" '
        'stroke="#bbb"/>',
    ]
    step = 10 if high - low <= 120 else 20
    tick = low
    while tick <= high:
        _, y = xy(0, tick)
        parts.append(
            f'<line x1="{LEFT}" y1="{y:.1f}" x2="{WIDTH - RIGHT}" y2="{y:.1f}" stroke="#e3e3e3"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end" '
            f'fill="#444">{tick:g}</text>'
        )
        tick += step
    for label, colour, values in series:
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values)))
        parts.append(
            f'<polyline fill="none" stroke="{colour}" stroke-width="1.6" points="{points}">'
            f"<title>{html.escape(label)}</title></polyline>"
        )
    marks = series[0][2] if series else []
    for i in flagged:
        x, y = xy(i, marks[i])
        other = ", ".join(f"{lab} {v[i]:.1f} dB" for lab, _, v in series if i < len(v))
        parts.append(
            f'<circle class="departs" cx="{x:.1f}" cy="{y:.1f}" r="4.5" fill="none" '
            f'stroke="{FLAG}" stroke-width="2"><title>layer {i}: target departs from the '
            f"simulation ({html.escape(other)})</title></circle>"
        )
    legend = [(label, colour) for label, colour, _ in series]
    if flagged:
        legend.append((f"target departs from the simulation ({len(flagged)})", FLAG))
    legend_x = LEFT + 8
    for label, colour in legend:
        parts.append(
            f'<rect x="{legend_x}" y="8" width="14" height="4" fill="{colour}"/>'
            f'<text x="{legend_x + 18}" y="14" font-size="12" fill="#222">'
            f"{html.escape(label)}</text>"
        )
        legend_x += 24 + 7 * len(label)
    parts.append(
        f'<text x="{WIDTH - RIGHT}" y="14" font-size="12" text-anchor="end" fill="#444">'
        f"{html.escape(title)}: target ran on {html.escape(where)}</text>"
        f'<text x="{LEFT + plot_w / 2:.0f}" y="{HEIGHT - 8}" font-size="12" text-anchor="middle" '
        f'fill="#444">quantized activations in graph order ({count}); y: SQNR dB vs float '
        f"(capped at {CAP_DB:g})</text>"
        "</svg>"
    )
    return "".join(parts)
