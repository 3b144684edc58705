"""Inline SVG line plots for the build report (no script, no external resource), made
through `safehtml.h` like the rest of the page."""

from __future__ import annotations

import math
from collections.abc import Sequence

from winml_recipes.safehtml import Markup, h, join

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
) -> Markup:
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
        h(
            '<svg width="{w}" height="{ht}" viewBox="0 0 {w} {ht}" role="img" '
            'class="layer-plot" aria-label="per-layer SQNR of {title}">'
            '<rect x="{x}" y="{y}" width="{pw}" height="{ph}" fill="#fafafa" stroke="#bbb"/>',
            w=WIDTH, ht=HEIGHT, title=title, x=LEFT, y=TOP, pw=plot_w, ph=plot_h,
        )
    ]  # fmt: skip
    step = 10 if high - low <= 120 else 20
    tick = low
    while tick <= high:
        _, y = xy(0, tick)
        parts.append(
            h(
                '<line x1="{}" y1="{y:.1f}" x2="{}" y2="{y:.1f}" stroke="#e3e3e3"/>'
                '<text x="{}" y="{:.1f}" font-size="11" text-anchor="end" fill="#444">{:g}'
                "</text>",
                LEFT, WIDTH - RIGHT, LEFT - 6, y + 4, tick, y=y,
            )
        )  # fmt: skip
        tick += step
    for label, colour, values in series:
        points = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(values)))
        parts.append(
            h(
                '<polyline fill="none" stroke="{}" stroke-width="1.6" points="{}">'
                "<title>{}</title></polyline>",
                colour, points, label,
            )
        )  # fmt: skip
    marks = series[0][2] if series else []
    for i in flagged:
        x, y = xy(i, marks[i])
        other = ", ".join(f"{lab} {v[i]:.1f} dB" for lab, _, v in series if i < len(v))
        parts.append(
            h(
                '<circle class="departs" cx="{:.1f}" cy="{:.1f}" r="4.5" fill="none" '
                'stroke="{}" stroke-width="2"><title>layer {}: target departs from the '
                "simulation ({})</title></circle>",
                x, y, FLAG, i, other,
            )
        )  # fmt: skip
    legend = [(label, colour) for label, colour, _ in series]
    if flagged:
        legend.append((f"target departs from the simulation ({len(flagged)})", FLAG))
    legend_x = LEFT + 8
    for label, colour in legend:
        parts.append(
            h(
                '<rect x="{}" y="8" width="14" height="4" fill="{}"/>'
                '<text x="{}" y="14" font-size="12" fill="#222">{}</text>',
                legend_x, colour, legend_x + 18, label,
            )
        )  # fmt: skip
        legend_x += 24 + 7 * len(label)
    parts.append(
        h(
            '<text x="{}" y="14" font-size="12" text-anchor="end" fill="#444">{}: target ran '
            'on {}</text><text x="{:.0f}" y="{}" font-size="12" text-anchor="middle" '
            'fill="#444">quantized activations in graph order ({}); y: SQNR dB vs float '
            "(capped at {:g})</text></svg>",
            WIDTH - RIGHT, title, where, LEFT + plot_w / 2, HEIGHT - 8, count, CAP_DB,
        )
    )  # fmt: skip
    return join(parts)
