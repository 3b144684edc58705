"""report.html: one self-contained page per build (inline CSS and SVG, images as data:
URIs, a Content-Security-Policy that forbids every load from the network, no scripts).

It holds the verdicts and task metrics, per-output metrics, a per-layer SQNR plot (target
and CPU simulation vs float, with the layers where the target departs from the simulation
marked: what verify recorded, passes/verify_layers.py), the picture of the last
`winml-recipes run`, node placement, step times and peak memory, and versions. It is made
from the build folder alone and runs nothing on the target (only `--layers`, asked for, on
a build whose verify recorded no per-layer data). A failed build's page leads with what
failed. Written at the end of every build; `winml-recipes report` rewrites it.
"""

from __future__ import annotations

import base64
import html
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from winml_recipes.buildfolder import BuildFolder, open_build
from winml_recipes.passes.verify_layers import LAYERS_ENV, LAYERS_MAX_MB, QUANTIZED
from winml_recipes.report_svg import layer_plot
from winml_recipes.sdk.ep import ran_on_name
from winml_recipes.standin import random_weights_note

REPORT = "report.html"
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; form-action 'none'"
ADHOC = "winml-adhoc-"  # the folder `build --onnx` generates its recipe in (api.build_onnx)
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
code{background:#f4f4f4;padding:0 3px} .random{background:#fff4d6;padding:6px 10px}
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
        where = ran_on_name(m) if m.get("verified_on") else "?"
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


def _recorded_layers(build: BuildFolder, name: str) -> dict[str, Any] | None:
    verify = _step(build.manifest["components"][name], "verify")
    layers = (verify or {}).get("metrics", {}).get("layers")
    return layers if isinstance(layers, dict) else None


def _not_recorded_why(build: BuildFolder) -> str:
    if build.failed:
        return "the build failed before verify recorded it"
    if build.precision not in QUANTIZED or build.device != "npu":
        return (
            f"recorded only for quantized npu builds ({build.device}/{build.precision} is not one)"
        )
    if os.environ.get(LAYERS_ENV) == "0":
        return f"turned off while it was built ({LAYERS_ENV}=0)"
    size = _model_mb(build)
    if size > LAYERS_MAX_MB:
        return f"models of {size:.0f} MB, above the {LAYERS_MAX_MB:.0f} MB default cap"
    return "verify did not record it (it did not run the model on the target)"


def _sample_words(build: BuildFolder, name: str) -> str:
    """What a recorded per-layer plot's sample is, in words that fit the model."""
    m = ((_step(build.manifest["components"][name], "verify") or {}).get("metrics")) or {}
    return f"the first verify measured ({m.get('data_source') or 'seeded inputs'})"


def _layers_section(
    build: BuildFolder,
    layers: bool | None,
    blocked: str | None,
    say: Callable[[str], None] | None,
) -> str:
    """The per-layer plot: from what verify recorded (no run here); computed on request
    (`layers=True`) where verify recorded nothing and the target may run (`blocked`)."""
    if build.precision not in QUANTIZED and layers is None:
        return (
            f'<p class="note">Not computed: a {_e(build.precision)} build has no quantized '
            f"activations to compare.</p>"
        )
    recorded = {c.name: _recorded_layers(build, c.name) for c in build.components}
    if layers is False:
        return '<p class="note">Not shown: turned off (--no-layers).</p>'
    cmd = f"<code>winml-recipes report {_e(build.folder)} --layers</code>"
    if not any(recorded.values()) and not layers:
        why = _not_recorded_why(build)
        extra = "" if build.failed else f" To compute it (another run on the target): {cmd}."
        return f'<p class="note">Not recorded: {_e(why)}.{extra}</p>'
    parts = [
        '<p class="note">Each quantized activation of the model on the target and on the '
        "CPU EP's simulation of Q/DQ, against the float model's tensor, in graph order, on "
        "one sample (said under each plot). Red marks: layers where the target departs from "
        "the simulation (below the threshold against it and 3 dB or more further from "
        "float).</p>"
    ]
    for comp in build.components:
        parts.append(f"<h3>{_e(comp.name)}</h3>")
        data = recorded.get(comp.name)
        if data is None and layers:
            data = _compute_layers(build, comp, blocked, say)
        if data is None:
            parts.append('<p class="note">not recorded by verify</p>')
            continue
        if data.get("error"):
            parts.append(f'<p class="note">not computed: {_e(data["error"])}</p>')
            continue
        parts.append(_layer_plot_and_table(build, comp.name, data))
    return "".join(parts)


def _compute_layers(
    build: BuildFolder, comp: Any, blocked: str | None, say: Callable[[str], None] | None
) -> dict[str, Any] | None:
    """On request: the per-layer record of one seeded or bundled sample, as verify makes it."""
    from winml_recipes.feeds import synthetic, take
    from winml_recipes.passes.verify_layers import layer_record
    from winml_recipes.runtime.target import run_on_target
    from winml_recipes.sdk.ep import shown_name

    if comp.model is None or comp.reference is None:
        return {"error": "no uncompiled model and float reference to compare"}
    if blocked is not None:
        return {"error": blocked}
    if say is not None:
        say(f"report: per-layer comparison of {comp.name} on {shown_name(build.ep_key)}")
    feed = take(synthetic(comp.contract, 1, 0), 1)[0]
    try:
        untapped = run_on_target(
            comp.model, [feed], build.device, {"allow_cpu_fallback": True}, ep=build.ep_key
        ).outputs[0]
    except Exception as exc:  # a report section that cannot be made says why
        return {"error": _first_line(exc)}
    data = layer_record(comp.model, comp.reference, feed, untapped, build.device, build.ep_key)
    data["source"] = "computed by the report on request, on one seeded sample"
    return data


def _layer_plot_and_table(build: BuildFolder, name: str, data: dict[str, Any]) -> str:
    from winml_recipes.passes.verify_layers import rows_of
    from winml_recipes.quant.divergence import TensorRow, first_divergence
    from winml_recipes.sdk.ep import shown_name

    rows = [
        TensorRow(r["tensor"], r["op_type"], "", float(r["target_vs_float_db"]),
                  float(r["simulation_vs_float_db"]), float(r["target_vs_simulation_db"]))
        for r in rows_of(data)
    ]  # fmt: skip
    if not rows:
        return '<p class="note">no quantized activations to compare</p>'
    threshold = float(data.get("threshold_db") or 30.0)
    departed = [i for i, r in enumerate(rows) if first_divergence([r], threshold) is not None]
    series = [
        ("target vs float", "#2060d0", [r.target_vs_float_db for r in rows]),
        ("CPU simulation vs float", "#e07b00", [r.simulation_vs_float_db for r in rows]),
    ]
    verify = _step(build.manifest["components"][name], "verify") or {}
    where = ran_on_name(verify.get("metrics") or {}) if verify else shown_name(build.ep_key)
    out = [layer_plot(name, series, where, flagged=departed)]
    source = data.get("source") or _sample_words(build, name)
    out.append(f'<p class="note">sample: {_e(source)}</p>')
    if departed:
        first = rows[departed[0]]
        out.append(
            f'<p class="fail">{len(departed)} layer(s) where the target departs from the '
            f"simulation; the first: {_e(first.tensor)} ({_e(first.op_type)}) "
            f"{first.target_vs_float_db:.1f} dB on the target vs "
            f"{first.simulation_vs_float_db:.1f} dB simulated. Where and why: "
            f"<code>winml-recipes compare {_e(build.folder)} --component {_e(name)}</code></p>"
        )
    worst = sorted(rows, key=lambda r: r.target_vs_float_db)[:8]
    flagged = {rows[i].tensor for i in departed}
    out.append(
        _table(
            [
                "lowest on the target",
                "op",
                "target vs float dB",
                "simulation vs float dB",
                "departs",
            ],
            [
                [
                    _e(r.tensor),
                    _e(r.op_type),
                    f'<span class="num">{_num(r.target_vs_float_db, ".1f")}</span>',
                    f'<span class="num">{_num(r.simulation_vs_float_db, ".1f")}</span>',
                    '<span class="fail">yes</span>' if r.tensor in flagged else "no",
                ]
                for r in worst
            ],
        )
    )
    return "".join(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


def _picture_section(build: BuildFolder) -> str:
    """The picture `winml-recipes run` drew into BUILD/run (reused: the report runs
    nothing); else one line on how to make it and what that costs."""
    import json

    from winml_recipes.runcost import run_cost

    if build.image_input() is None:
        return '<p class="note">not an image model: no picture</p>'
    cmd = f"<code>winml-recipes run {_e(build.folder)}</code>"
    summary_path = build.folder / "run" / "summary.json"
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
        png = (summary_path.parent / Path(summary["picture"]).name).read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        if build.failed:
            return '<p class="note">not made: the build failed</p>'
        cost = run_cost(build)
        about = f" (about {cost.seconds:.0f} s on the target here)" if cost.seconds else ""
        return (
            f'<p class="note">not made during the build (the report runs nothing on the '
            f"target): {cmd} makes it{_e(about)}, then <code>winml-recipes report "
            f"{_e(build.folder)}</code> shows it here.</p>"
        )
    photo = Path(summary.get("image") or "photo").name
    notes = "".join(f"<li>{_e(n)}</li>" for n in summary.get("notes", []))
    if random_weights_note(build.manifest.get("catalog"), build.manifest.get("source")):
        notes += (
            "<li>The weights are random (a stand-in): this picture shows that the target "
            "agrees with the float model, not what the real model sees.</li>"
        )
    data = base64.b64encode(png).decode("ascii")
    return (
        f"<p>The last <code>winml-recipes run</code> of this build, on <code>{_e(photo)}"
        f"</code>: the float models on the CPU EP and the build on its target.</p>"
        + (f"<ul class='note'>{notes}</ul>" if notes else "")
        + f'<img class="run" alt="run on {_e(photo)}" src="data:image/png;base64,{data}">'
    )


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


def _recipe_words(build: BuildFolder) -> str:
    """The recipe as the user gave it: its path, or for `build --onnx` (whose recipe was
    generated into a folder deleted after the build) the model file it was built from."""
    m = build.manifest
    path = m["recipe"]["path"]
    if ADHOC not in Path(path).parent.parent.name:
        return f"recipe <code>{_e(path)}</code>"
    sources = [
        str((c.get("source") or {}).get("path") or (c.get("source") or {}).get("ref") or "")
        for c in m["components"].values()
    ]
    shown = ", ".join(s for s in sources if s) or _e(m.get("model"))
    return f"built with <code>winml-recipes build --onnx {_e(shown)}</code>"


def _failure_lead(build: BuildFolder) -> str:
    """A failed build's page starts with what failed: the step, the error, the evidence."""
    m = build.manifest
    step = m.get("failing_step") or "a step"
    return (
        f'<p><span class="verdict fail">build FAILED at {_e(step)}</span></p>'
        f'<p class="fail">{_e(m.get("error") or "no error recorded")}</p>'
        f'<p class="note">This folder holds the evidence of the failed build (what ran up '
        f"to the failing step); nothing in it is deployable.</p>"
    )


def render(
    build: BuildFolder,
    layers: bool | None = None,
    budget_mb: float | None = None,
    say: Callable[[str], None] | None = None,
) -> str:
    """The page's HTML, from the build folder alone: the report runs nothing on the target
    (the per-layer plot is verify's record, the picture `run`'s), except the per-layer
    comparison on request (`layers=True`) where verify recorded none, and only where
    `report_bounds` allows it (verify ran it there; within `budget_mb`, default: the
    build's memory budget; never for a failed build)."""
    blocked = None
    if layers:
        from winml_recipes.engine.budget import resolve_budget
        from winml_recipes.report_bounds import why_not_run

        try:
            budget = budget_mb if budget_mb is not None else resolve_budget(None)
            blocked = "the build failed" if build.failed else why_not_run(build, budget)
        except Exception as exc:  # what cannot be estimated is not run
            blocked = f"its memory could not be estimated ({_first_line(exc)})"
    overall = _overall(build)
    if build.failed:
        lead = _failure_lead(build)
    else:
        if overall is None:
            verified = any(_step(r, "verify") for r in build.manifest["components"].values())
            verdict = "no gates set" if verified else "no gates checked: no component was verified"
        else:
            verdict = "every gate passed" if overall else "a gate FAILED"
        css = "none" if overall is None else ("pass" if overall else "fail")
        lead = f'<p><span class="verdict {css}">{_e(verdict)}</span></p>'
    m = build.manifest
    random = random_weights_note(m.get("catalog"), m.get("source"))
    if random:
        lead += f'<p class="random"><strong>{_e(random[:1].upper() + random[1:])}.</strong></p>'
    sections = [
        ("Verdicts and metrics", _verify_section(build)),
        ("Run on a held-out photo", _picture_section(build)),
        ("Per-layer SQNR against float", _layers_section(build, layers, blocked, say)),
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
        f"<p class='note'>model {_e(m.get('model'))}, task {_e(build.task)}, "
        f"{_recipe_words(build)}, {_e(m['tool']['name'])} {_e(m['tool']['version'])}</p>"
        f"{lead}{body}</body></html>\n"
    )


def write_report(
    build_dir: Path,
    layers: bool | None = None,
    budget_mb: float | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Write BUILD_DIR/report.html (replacing it at once) and return its path."""
    build = open_build(build_dir, contracts=True)
    out = build.folder / REPORT
    tmp = out.with_name(f".{REPORT}.tmp")
    tmp.write_text(render(build, layers, budget_mb, say), encoding="utf-8")
    tmp.replace(out)
    return out
