"""report.html: one self-contained page per build (inline CSS and SVG, images as data:
URIs, a Content-Security-Policy that forbids every load from the network, no scripts).

It holds the verdicts and task metrics, per-output metrics, a per-layer SQNR plot (target
and CPU simulation vs float; computed here, only where cheap unless asked), the `run`
picture on the bundled held-out photo, node placement, step times and peak memory, and
versions. Written at the end of every successful build; `winml-recipes report` rewrites it.
"""

from __future__ import annotations

import base64
import html
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from winml_recipes.buildfolder import BuildFolder, open_build
from winml_recipes.report_svg import layer_plot

REPORT = "report.html"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; form-action 'none'"
LAYERS_MAX_MB = 64.0  # per-layer comparison by default only for builds this small
QUANTIZED = ("uint8", "int8", "w8a16")
CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:24px;color:#1b1b1b;max-width:1400px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:16px 0 6px} table{border-collapse:collapse;margin:4px 0 10px}
td,th{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4} td:has(>span.num){text-align:right}
.num{font-variant-numeric:tabular-nums}
.pass{color:#0a7a2a;font-weight:600} .fail{color:#b3141b;font-weight:600}
.note{color:#555} .verdict{font-size:18px;padding:6px 10px;display:inline-block;border-radius:4px}
.verdict.pass{background:#e3f6e8} .verdict.fail{background:#fde6e7}
.verdict.none{background:#f0f0f0;color:#555}
img.run{max-width:100%;border:1px solid #ddd} svg{background:#fff;border:1px solid #ddd}
code{background:#f4f4f4;padding:0 3px}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: str = ".4g") -> str:
    return f"{value:{digits}}" if isinstance(value, int | float) else _e(value)


def _table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Cells are HTML already (escape what comes from data before)."""
    th = "".join(f"<th>{_e(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{th}</tr>{body}</table>"


def _verdict(passed: bool | None) -> str:
    if passed is None:
        return '<span class="note">not gated</span>'
    return '<span class="pass">pass</span>' if passed else '<span class="fail">FAIL</span>'


def _step(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next(
        (s for s in record["steps"] if s["pass"] == name and s["status"] != "skipped"), None
    )


def _verify_section(build: BuildFolder) -> str:
    parts = []
    for name, record in build.manifest["components"].items():
        verify = _step(record, "verify")
        parts.append(f"<h3>{_e(name)}</h3>")
        if verify is None:
            skipped = next((s for s in record["steps"] if s["pass"] == "verify"), None)
            why = skipped.get("reason", "no verify step") if skipped else "no verify step"
            parts.append(f'<p class="note">not verified: {_e(why)}</p>')
            continue
        m = verify["metrics"]
        where = m.get("verified_on", "?")
        parts.append(
            f"<p>verified on <b>{_e(where)}</b> with {_e(m.get('data_source', '?'))} "
            f"({_e(m.get('samples', '?'))} samples): {_verdict(m.get('passed'))}</p>"
        )
        task = m.get("task_metric")
        if task:
            values = ", ".join(f"{_e(k)} {_num(v)}" for k, v in task.get("values", {}).items())
            parts.append(f"<p>{_e(task.get('task'))} ({_e(task.get('metric'))}): {values}</p>")
        gates = m.get("gates", [])
        if gates:
            rows = [
                [_e(g["output"]), _e(g["metric"]), f'<span class="num">{_num(g["value"])}</span>',
                 f'{_e(g["comparison"])} {_num(g["threshold"])}',
                 f'<span class="num">{_num(g["margin"], "+.3g")}</span>',
                 _verdict(g["passed"])]
                for g in gates
            ]  # fmt: skip
            parts.append(_table(["output", "metric", "value", "gate", "margin", "verdict"], rows))
        sim = m.get("cpu_simulation", {}).get("outputs", {})
        rows = []
        for out, om in m.get("outputs", {}).items():
            s = sim.get(out, {})
            rows.append(
                [_e(out)]
                + [
                    f'<span class="num">{_num(om.get(k))}</span>'
                    for k in ("sqnr_db", "cosine", "max_abs", "mean_abs")
                ]
                + [f'<span class="num">{_num(s.get("sqnr_db", "-"))}</span>']
            )
        if rows:
            parts.append(
                _table(
                    [
                        "output",
                        f"SQNR dB ({where})",
                        "cosine",
                        "max_abs",
                        "mean_abs",
                        "SQNR dB (CPU simulation)",
                    ],
                    rows,
                )
            )
    return "".join(parts)


def _overall(build: BuildFolder) -> bool | None:
    verdicts = [
        v["metrics"].get("passed")
        for r in build.manifest["components"].values()
        if (v := _step(r, "verify")) is not None and "passed" in v["metrics"]
    ]
    return all(verdicts) if verdicts else None


def _model_mb(build: BuildFolder) -> float:
    paths = [p for c in build.components for p in (c.model, c.reference) if p is not None]
    return sum(f.stat().st_size for p in paths for f in p.parent.glob("model.onnx*")) / 1e6


LAYERS_ENV = "WINML_RECIPES_REPORT_LAYERS"  # 0: builds' reports skip the per-layer plot


def _layers_wanted(build: BuildFolder, layers: bool | None) -> tuple[bool, str]:
    if layers is not None:
        return layers, "asked for" if layers else "turned off (--no-layers)"
    if os.environ.get(LAYERS_ENV) == "0":
        return False, f"turned off ({LAYERS_ENV}=0)"
    if build.precision not in QUANTIZED or build.device != "npu":
        return False, (
            f"computed by default only for quantized npu builds ({build.device}/"
            f"{build.precision} is not one)"
        )
    size = _model_mb(build)
    if size > LAYERS_MAX_MB:
        return False, f"models of {size:.0f} MB, above the {LAYERS_MAX_MB:.0f} MB default cap"
    return True, f"quantized npu build, models of {size:.1f} MB"


def _layers_section(
    build: BuildFolder, feeds: dict[str, dict], layers: bool | None, blocked: str | None
) -> str:
    from winml_recipes.feeds import synthetic, take
    from winml_recipes.quant.divergence import compare_tensors

    wanted, why = _layers_wanted(build, layers)
    cmd = f"<code>winml-recipes report {_e(build.folder)} --layers</code>"
    if not wanted and layers is None and build.precision not in QUANTIZED:
        return (
            f'<p class="note">Not computed: a {_e(build.precision)} build has no quantized '
            f"activations to compare.</p>"
        )
    if not wanted:
        return f'<p class="note">Not computed: {_e(why)}. To compute it: {cmd}.</p>'
    if blocked is not None:
        return f'<p class="note">Not computed: {_e(blocked)}.</p>'
    parts = [
        f'<p class="note">Each quantized activation of the model on the target and on the '
        f"CPU EP's simulation of Q/DQ, against the float model's tensor, in graph order; one "
        f"sample (the photo and prompt of the picture above, the decoder fed the float "
        f"encoder's outputs where it has an image input; else seeded inputs). Computed because: "
        f"{_e(why)}.</p>"
    ]
    for comp in build.components:
        parts.append(f"<h3>{_e(comp.name)}</h3>")
        if comp.model is None or comp.reference is None:
            parts.append('<p class="note">no uncompiled model and float reference to compare</p>')
            continue
        feed = feeds.get(comp.name) or take(synthetic(comp.contract, 1, 0), 1)[0]
        try:
            with tempfile.TemporaryDirectory(prefix="winml-report-") as tmp:
                rows, record = compare_tensors(
                    comp.model, comp.reference, [feed], build.device, Path(tmp), build.ep_key
                )
        except Exception as exc:  # a report section that cannot be made says why
            parts.append(f'<p class="note">not computed: {_e(_first_line(exc))}</p>')
            continue
        if not rows:
            parts.append('<p class="note">no quantized activations to compare</p>')
            continue
        series = [
            ("target vs float", "#2060d0", [r.target_vs_float_db for r in rows]),
            ("CPU simulation vs float", "#e07b00", [r.simulation_vs_float_db for r in rows]),
        ]
        parts.append(layer_plot(comp.name, series, record.get("verified_on", build.device)))
        worst = sorted(rows, key=lambda r: r.target_vs_float_db)[:8]
        parts.append(
            _table(
                ["lowest on the target", "op", "target vs float dB", "simulation vs float dB"],
                [
                    [
                        _e(r.tensor),
                        _e(r.op_type),
                        f'<span class="num">{_num(r.target_vs_float_db, ".1f")}</span>',
                        f'<span class="num">{_num(r.simulation_vs_float_db, ".1f")}</span>',
                    ]
                    for r in worst
                ],
            )
        )
    return "".join(parts)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def _picture_section(build: BuildFolder, blocked: str | None) -> tuple[str, dict[str, dict]]:
    """The run on the bundled held-out photo (image models), and the float feeds it used."""
    from winml_recipes.runbuild import run_and_write, sample_photo

    if build.image_input() is None:
        return '<p class="note">not an image model: no picture</p>', {}
    if blocked is not None:
        cmd = f"<code>winml-recipes run {_e(build.folder)}</code>"
        return f'<p class="note">not made: {_e(blocked)}; {cmd} makes it on request.</p>', {}
    photo = sample_photo()
    with tempfile.TemporaryDirectory(prefix="winml-report-") as tmp:
        try:
            outcome = run_and_write(build.folder, image=photo, output_dir=Path(tmp))
        except Exception as exc:  # a report section that cannot be made says why
            return f'<p class="note">not made: {_e(_first_line(exc))}</p>', {}
        summary = outcome.summary
        png = Path(summary["picture"]).read_bytes() if summary.get("picture") else None
    feeds = outcome.float_run.feeds if outcome.float_run is not None else {}
    notes = "".join(f"<li>{_e(n)}</li>" for n in summary.get("notes", []))
    text = (
        f"<p>The bundled held-out photo <code>{_e(photo.name)}</code> through the whole "
        f"pipeline: the float models on the CPU EP and the build on its target. The same as "
        f"<code>winml-recipes run {_e(build.folder)}</code> (which defaults to this photo).</p>"
        + (f"<ul class='note'>{notes}</ul>" if notes else "")
    )
    if png is not None:
        data = base64.b64encode(png).decode("ascii")
        text += (
            f'<img class="run" alt="run on {_e(photo.name)}" src="data:image/png;base64,{data}">'
        )
    return text, feeds


NO_PLACEMENT = (
    "not recorded: the placement is what verify records when it runs a model on the target "
    "(no component's verify did)"
)


def _placement_section(build: BuildFolder) -> str:
    rows, recorded = [], False
    for name, record in build.manifest["components"].items():
        verify = _step(record, "verify")
        placement = (verify or {}).get("metrics", {}).get("placement")
        recorded = recorded or bool(placement)
        if not placement:
            missing = '<span class="note">not recorded (verify did not run it on the target)</span>'
            rows.append([_e(name), missing, "-", "-"])
            continue
        nodes = ", ".join(f"{_e(k)}: {v}" for k, v in placement.get("nodes", {}).items())
        parts = ", ".join(f"{_e(k)}: {v}" for k, v in placement.get("partitions", {}).items())
        fallback = ", ".join(
            f"{_e(n['name'])} ({_e(n['op_type'])})" for n in placement.get("fallback_nodes", [])
        )
        rows.append([_e(name), nodes, parts, fallback or "none"])
    if not recorded:
        return f'<p class="note">{_e(NO_PLACEMENT)}</p>'
    return _table(["component", "nodes per EP", "partitions", "fallback nodes"], rows)


def _steps_section(build: BuildFolder) -> str:
    rows = []
    for name, record in build.manifest["components"].items():
        for s in record["steps"]:
            status = s["status"] + (f": {s['reason']}" if s.get("reason") else "")
            rows.append(
                [
                    _e(name),
                    _e(s["pass"]),
                    _e(status),
                    f'<span class="num">{_num(s.get("wall_seconds", ""), ".2f")}</span>',
                    f'<span class="num">{_num(s.get("peak_rss_mb", ""), ".0f")}</span>',
                    f'<span class="num">{_num(s.get("memory_estimate_mb", ""), ".0f")}</span>',
                ]
            )
    wall = build.manifest.get("wall_seconds")
    head = f"<p>build wall time {_num(wall, '.1f')} s</p>" if wall is not None else ""
    return head + _table(
        ["component", "step", "status", "seconds", "peak RSS MB", "estimate MB"], rows
    )


def _versions_section(build: BuildFolder) -> str:
    m = build.manifest
    rows = [[_e(k), _e(v)] for k, v in m.get("versions", {}).items()]
    seen = set()
    for record in m["components"].values():
        for s in record["steps"]:
            ep = s.get("metrics", {}).get("execution_provider") or {}
            if not isinstance(ep, dict):  # a manifest written by another version
                continue
            for k, v in (ep.get("versions") or {}).items():
                if k not in seen and k not in m.get("versions", {}):
                    seen.add(k)
                    rows.append([_e(k), _e(v)])
    rows.append(["recipe sha256", _e(m["recipe"]["sha256"])])
    return _table(["component", "version"], rows)


def _artifacts_section(build: BuildFolder) -> str:
    rows = []
    for name, record in build.manifest["components"].items():
        for f in record["artifact"]["files"]:
            rows.append(
                [
                    _e(name),
                    f"<code>{_e(f['path'])}</code>",
                    f'<span class="num">{_e(size_text(f["size_bytes"]))}</span>',
                ]
            )
    return _table(["component", "file", "size"], rows) + _split_section(build)


def size_text(size_bytes: int) -> str:
    """A file size in the unit that keeps it readable: 812 B, 3.4 kB, 151 kB, 2.35 MB."""
    if size_bytes < 1000:
        return f"{size_bytes} B"
    value, unit = size_bytes / 1000, "kB"
    for larger in ("MB", "GB"):
        if round(value) < 1000:
            break
        value, unit = value / 1000, larger
    return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"


def _split_section(build: BuildFolder) -> str:
    """Components compiled in parts: one row per part (one EPContext node each)."""
    rows = []
    for name, record in build.manifest["components"].items():
        for s in record["steps"]:
            split = (s.get("metrics") or {}).get("split")
            if s["pass"] != "compile" or not isinstance(split, dict):
                continue
            for p in split.get("parts") or []:
                rows.append(
                    [
                        _e(name),
                        _e(p.get("index")),
                        f'<span class="num">{_e(p.get("nodes"))}</span>',
                        _e(", ".join(p.get("inputs") or [])),
                        _e(", ".join(p.get("outputs") or [])),
                        f'<span class="num">{_num(p.get("estimate_mb", ""), ".0f")}</span>',
                        f"<code>{_e(', '.join(p.get('binaries') or []))}</code>",
                    ]
                )
    if not rows:
        return ""
    head = "<p>compiled in parts: model_ctx.onnx holds one EPContext node per part</p>"
    return head + _table(
        ["component", "part", "nodes", "inputs", "outputs", "estimate MB", "binary"], rows
    )


def render(build: BuildFolder, layers: bool | None = None, budget_mb: float | None = None) -> str:
    """The page's HTML. The build runs on its target for the picture and the per-layer plot
    only where `report_bounds` allows it (verify ran it there; within `budget_mb`, default:
    the build's memory budget)."""
    from winml_recipes.engine.budget import resolve_budget
    from winml_recipes.report_bounds import why_not_run

    try:
        blocked = why_not_run(build, budget_mb if budget_mb is not None else resolve_budget(None))
    except Exception as exc:  # what cannot be estimated is not run
        blocked = f"its memory could not be estimated ({_first_line(exc)})"
    picture, feeds = _picture_section(build, blocked)
    overall = _overall(build)
    if overall is None:
        verified = any(_step(r, "verify") for r in build.manifest["components"].values())
        verdict = "no gates set" if verified else "no gates checked: no component was verified"
    else:
        verdict = "every gate passed" if overall else "a gate FAILED"
    css = "none" if overall is None else ("pass" if overall else "fail")
    m = build.manifest
    sections = [
        ("Verdicts and metrics", _verify_section(build)),
        ("Run on a held-out photo", picture),
        ("Per-layer SQNR against float", _layers_section(build, feeds, layers, blocked)),
        ("Node placement", _placement_section(build)),
        ("Steps: time and peak memory", _steps_section(build)),
        ("Files", _artifacts_section(build)),
        ("Versions", _versions_section(build)),
    ]
    body = "".join(f"<h2>{_e(title)}</h2>{content}" for title, content in sections)
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
        f"<title>{_e(build.label)}: winml-recipes build report</title>"
        f"<style>{CSS}</style></head><body>"
        f"<h1>{_e(build.label)}</h1>"
        f"<p class='note'>model {_e(m.get('model'))}, task {_e(build.task)}, recipe "
        f"<code>{_e(m['recipe']['path'])}</code>, {_e(m['tool']['name'])} "
        f"{_e(m['tool']['version'])}</p>"
        f'<p><span class="verdict {css}">{_e(verdict)}</span></p>'
        f"{body}</body></html>\n"
    )


def write_report(
    build_dir: Path, layers: bool | None = None, budget_mb: float | None = None
) -> Path:
    """Write BUILD_DIR/report.html (replacing it at once) and return its path."""
    build = open_build(build_dir, contracts=True)
    out = build.folder / REPORT
    tmp = out.with_name(f".{REPORT}.tmp")
    tmp.write_text(render(build, layers, budget_mb), encoding="utf-8")
    tmp.replace(out)
    return out
