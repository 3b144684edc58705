"""report.html: one self-contained page per build (inline CSS and SVG, images as data:
URIs, a Content-Security-Policy that forbids every load from the network, no scripts).

A manifest is untrusted input (a build folder travels): every piece of HTML is made by
`safehtml.h` (autoescaping: no manifest value adds markup). The CSP allows only the page's
own <style> (by its sha256), so markup that got in anyway could neither restyle the page
nor load anything.

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
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from winml_recipes.buildfolder import BuildFolder, open_build
from winml_recipes.passes.verify_layers import LAYERS_ENV, LAYERS_MAX_MB, QUANTIZED
from winml_recipes.report_svg import layer_plot
from winml_recipes.safehtml import Markup
from winml_recipes.safehtml import h as _h
from winml_recipes.safehtml import join as _join
from winml_recipes.sdk.ep import ran_on_name
from winml_recipes.standin import random_weights_note

REPORT = "report.html"
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
_STYLE_HASH = base64.b64encode(hashlib.sha256(CSS.encode("utf-8")).digest()).decode("ascii")
CSP = (
    f"default-src 'none'; img-src data:; style-src 'sha256-{_STYLE_HASH}'; "
    "base-uri 'none'; form-action 'none'"
)


def _num(value: Any, digits: str = ".4g") -> str:
    """A number in `digits` format; anything else as text (escaped where it is used)."""
    return f"{value:{digits}}" if isinstance(value, int | float) else str(value)


def _n(value: Any, digits: str = ".4g") -> Markup:
    """A number cell's content (right-aligned by the page's style)."""
    return _h('<span class="num">{}</span>', _num(value, digits))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> Markup:
    """Cells are fragments or plain values (escaped)."""
    th = _join(_h("<th>{}</th>", h) for h in head)
    body = _join(_h("<tr>{}</tr>", _join(_h("<td>{}</td>", c) for c in row)) for row in rows)
    return _h("<table><tr>{}</tr>{}</table>", th, body)


def _verdict(passed: bool | None) -> Markup:
    if passed is None:
        return _h('<span class="note">not gated</span>')
    return _h('<span class="pass">pass</span>' if passed else '<span class="fail">FAIL</span>')


def _passed(metrics: dict[str, Any]) -> bool | None:
    """A component's verdict as its rows show it: the recorded verdict, and a FAIL for any
    deciding (not advisory) gate row that failed: a manifest cannot call a component passed
    beside a failed gate."""
    passed = metrics.get("passed")
    if passed is None:
        return None
    gates = metrics.get("gates") or []
    return passed is True and all(g.get("passed") is True or g.get("advisory") for g in gates)


def _step(record: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next(
        (s for s in record["steps"] if s["pass"] == name and s["status"] != "skipped"), None
    )


def _verify_section(build: BuildFolder) -> Markup:
    parts = []
    for name, record in build.manifest["components"].items():
        verify = _step(record, "verify")
        parts.append(_h("<h3>{}</h3>", name))
        if verify is None:
            skipped = next((s for s in record["steps"] if s["pass"] == "verify"), None)
            why = skipped.get("reason", "no verify step") if skipped else "no verify step"
            parts.append(_h('<p class="note">not verified: {}</p>', why))
            continue
        m = verify["metrics"]
        where = ran_on_name(m) if m.get("verified_on") else "?"
        parts.append(
            _h(
                "<p>verified on <b>{}</b> with {} ({} samples): {}</p>",
                where, m.get("data_source", "?"), m.get("samples", "?"), _verdict(_passed(m)),
            )
        )  # fmt: skip
        choice = (_step(record, "quantize") or {}).get("metrics", {}).get("format_choice") or {}
        if choice.get("kept") not in (None, "static"):
            parts.append(
                _h('<p class="quantized">quantized <b>{}</b>: {}</p>', choice["kept"],
                   choice.get("why", ""))
            )  # fmt: skip
        task = m.get("task_metric")
        if task:
            values = _join(
                (_h("{} {}", k, _num(v)) for k, v in task.get("values", {}).items()), ", "
            )
            parts.append(_h("<p>{} ({}): {}</p>", task.get("task"), task.get("metric"), values))
        gates = m.get("gates", [])
        if gates:
            rows = [
                [g["output"], g["metric"], _n(g["value"]),
                 _h("{} {}", g["comparison"], _num(g["threshold"])),
                 _n(g["margin"], "+.3g"), _verdict(g["passed"])]
                for g in gates
            ]  # fmt: skip
            parts.append(_table(["output", "metric", "value", "gate", "margin", "verdict"], rows))
        sim = m.get("cpu_simulation", {}).get("outputs", {})
        rows = []
        for out, om in m.get("outputs", {}).items():
            s = sim.get(out, {})
            rows.append(
                [out]
                + [_n(om.get(k)) for k in ("sqnr_db", "cosine", "max_abs", "mean_abs")]
                + [_n(s.get("sqnr_db", "-"))]
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
    return _join(parts)


def _overall(build: BuildFolder) -> bool | None:
    verdicts = [
        _passed(v["metrics"])
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
) -> Markup:
    """The per-layer plot: from what verify recorded (no run here); computed on request
    (`layers=True`) where verify recorded nothing and the target may run (`blocked`)."""
    if build.precision not in QUANTIZED and layers is None:
        return _h(
            '<p class="note">Not computed: a {} build has no quantized activations to compare.</p>',
            build.precision,
        )
    recorded = {c.name: _recorded_layers(build, c.name) for c in build.components}
    if layers is False:
        return _h('<p class="note">Not shown: turned off (--no-layers).</p>')
    cmd = _h("<code>winml-recipes report {} --layers</code>", build.folder)
    if not any(recorded.values()) and not layers:
        why = _not_recorded_why(build)
        extra = _h(" To compute it (another run on the target): {}.", cmd)
        return _h('<p class="note">Not recorded: {}.{}</p>', why, "" if build.failed else extra)
    parts = [
        _h(
            '<p class="note">Each quantized activation of the model on the target and on the '
            "CPU EP's simulation of Q/DQ, against the float model's tensor, in graph order, on "
            "one sample (said under each plot). Red marks: layers where the target departs from "
            "the simulation (below the threshold against it and 3 dB or more further from "
            "float).</p>"
        )
    ]
    for comp in build.components:
        parts.append(_h("<h3>{}</h3>", comp.name))
        data = recorded.get(comp.name)
        if data is None and layers:
            data = _compute_layers(build, comp, blocked, say)
        if data is None:
            parts.append(_h('<p class="note">not recorded by verify</p>'))
            continue
        if data.get("error"):
            parts.append(_h('<p class="note">not computed: {}</p>', data["error"]))
            continue
        parts.append(_layer_plot_and_table(build, comp.name, data))
    return _join(parts)


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


def _layer_plot_and_table(build: BuildFolder, name: str, data: dict[str, Any]) -> Markup:
    from winml_recipes.passes.verify_layers import rows_of
    from winml_recipes.quant.divergence import TensorRow, first_divergence
    from winml_recipes.sdk.ep import shown_name

    rows = [
        TensorRow(r["tensor"], r["op_type"], "", float(r["target_vs_float_db"]),
                  float(r["simulation_vs_float_db"]), float(r["target_vs_simulation_db"]))
        for r in rows_of(data)
    ]  # fmt: skip
    if not rows:
        return _h('<p class="note">no quantized activations to compare</p>')
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
    out.append(_h('<p class="note">sample: {}</p>', source))
    if departed:
        first = rows[departed[0]]
        out.append(
            _h(
                '<p class="fail">{} layer(s) where the target departs from the simulation; '
                "the first: {} ({}) {:.1f} dB on the target vs {:.1f} dB simulated. Where and "
                "why: <code>winml-recipes compare {} --component {}</code></p>",
                len(departed), first.tensor, first.op_type, first.target_vs_float_db,
                first.simulation_vs_float_db, build.folder, name,
            )
        )  # fmt: skip
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
                    r.tensor,
                    r.op_type,
                    _n(r.target_vs_float_db, ".1f"),
                    _n(r.simulation_vs_float_db, ".1f"),
                    _h('<span class="fail">yes</span>') if r.tensor in flagged else "no",
                ]
                for r in worst
            ],
        )
    )
    return _join(out)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return (text.splitlines() or [type(exc).__name__])[0][:300]


MAX_PICTURE_BYTES = 32 << 20  # a run picture is a few hundred kB


def _picture_section(build: BuildFolder) -> Markup:
    """The picture `winml-recipes run` drew into BUILD/run (reused: the report runs
    nothing); else one line on how to make it and what that costs."""
    from winml_recipes.buildfolder import inside
    from winml_recipes.runcost import run_cost
    from winml_recipes.sdk.errors import WinmlError
    from winml_recipes.untrusted import read_json_bounded

    if build.image_input() is None:
        return _h('<p class="note">not an image model: no picture</p>')
    cmd = _h("<code>winml-recipes run {}</code>", build.folder)
    try:  # only files in the build folder (buildfolder.inside): a link out is never embedded
        summary_path = inside(build.folder, "run/summary.json", "run")
        summary = read_json_bounded(summary_path) if summary_path else {}
        png_path = inside(build.folder, f"run/{Path(summary['picture']).name}", "run")
        if png_path is None or png_path.stat().st_size > MAX_PICTURE_BYTES:
            raise ValueError("no picture")
        png = png_path.read_bytes()
    except (OSError, ValueError, KeyError, TypeError, WinmlError):
        if build.failed:
            return _h('<p class="note">not made: the build failed</p>')
        cost = run_cost(build)
        about = f" (about {cost.seconds:.0f} s on the target here)" if cost.seconds else ""
        return _h(
            '<p class="note">not made during the build (the report runs nothing on the '
            "target): {} makes it{}, then <code>winml-recipes report {}</code> shows it "
            "here.</p>",
            cmd, about, build.folder,
        )  # fmt: skip
    photo = Path(summary.get("image") or "photo").name
    notes = _join(_h("<li>{}</li>", n) for n in summary.get("notes", []))
    if random_weights_note(build.manifest.get("catalog"), build.manifest.get("source")):
        notes = _join([notes, _h(
            "<li>The weights are random (a stand-in): this picture shows that the target "
            "agrees with the float model, not what the real model sees.</li>"
        )])  # fmt: skip
    data = base64.b64encode(png).decode("ascii")
    return _h(
        "<p>The last <code>winml-recipes run</code> of this build, on <code>{photo}</code>: "
        "the float models on the CPU EP and the build on its target.</p>{notes}"
        '<img class="run" alt="run on {photo}" src="data:image/png;base64,{data}">',
        photo=photo, data=data, notes=_h("<ul class='note'>{}</ul>", notes) if notes else "",
    )  # fmt: skip


NO_PLACEMENT = (
    "not recorded: the placement is what verify records when it runs a model on the target "
    "(no component's verify did)"
)


def _placement_section(build: BuildFolder) -> Markup:
    rows, recorded = [], False
    for name, record in build.manifest["components"].items():
        verify = _step(record, "verify")
        placement = (verify or {}).get("metrics", {}).get("placement")
        recorded = recorded or bool(placement)
        if not placement:
            missing = _h(
                '<span class="note">not recorded (verify did not run it on the target)</span>'
            )
            rows.append([name, missing, "-", "-"])
            continue
        nodes = ", ".join(f"{k}: {v}" for k, v in placement.get("nodes", {}).items())
        parts = ", ".join(f"{k}: {v}" for k, v in placement.get("partitions", {}).items())
        fallback = ", ".join(
            f"{n['name']} ({n['op_type']})" for n in placement.get("fallback_nodes", [])
        )
        rows.append([name, nodes, parts, fallback or "none"])  # plain text: escaped in cells
    if not recorded:
        return _h('<p class="note">{}</p>', NO_PLACEMENT)
    return _table(["component", "nodes per EP", "partitions", "fallback nodes"], rows)


def _steps_section(build: BuildFolder) -> Markup:
    rows = []
    for name, record in build.manifest["components"].items():
        for s in record["steps"]:
            status = s["status"] + (f": {s['reason']}" if s.get("reason") else "")
            rows.append(
                [
                    name,
                    s["pass"],
                    status,
                    _n(s.get("wall_seconds", ""), ".2f"),
                    _n(s.get("peak_rss_mb", ""), ".0f"),
                    _n(s.get("memory_estimate_mb", ""), ".0f"),
                ]
            )
    wall = build.manifest.get("wall_seconds")
    head = _h("<p>build wall time {} s</p>", _num(wall, ".1f")) if wall is not None else ""
    return head + _table(
        ["component", "step", "status", "seconds", "peak RSS MB", "estimate MB"], rows
    )


def _versions_section(build: BuildFolder) -> Markup:
    m = build.manifest
    rows = [[k, v] for k, v in m.get("versions", {}).items()]
    seen = set()
    for record in m["components"].values():
        for s in record["steps"]:
            ep = s.get("metrics", {}).get("execution_provider") or {}
            if not isinstance(ep, dict):  # a manifest written by another version
                continue
            for k, v in (ep.get("versions") or {}).items():
                if k not in seen and k not in m.get("versions", {}):
                    seen.add(k)
                    rows.append([k, v])
    rows.append(["recipe sha256", m["recipe"]["sha256"]])
    return _table(["component", "version"], rows)


def _artifacts_section(build: BuildFolder) -> Markup:
    rows = []
    for name, record in build.manifest["components"].items():
        for f in record["artifact"]["files"]:
            rows.append(
                [
                    name,
                    _h("<code>{}</code>", f["path"]),
                    _h('<span class="num">{}</span>', size_text(f["size_bytes"])),
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


def _split_section(build: BuildFolder) -> Markup:
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
                        name,
                        p.get("index"),
                        _h('<span class="num">{}</span>', p.get("nodes")),
                        ", ".join(p.get("inputs") or []),
                        ", ".join(p.get("outputs") or []),
                        _n(p.get("estimate_mb", ""), ".0f"),
                        _h("<code>{}</code>", ", ".join(p.get("binaries") or [])),
                    ]
                )
    if not rows:
        return _h("")
    head = _h("<p>compiled in parts: model_ctx.onnx holds one EPContext node per part</p>")
    return head + _table(
        ["component", "part", "nodes", "inputs", "outputs", "estimate MB", "binary"], rows
    )


def _recipe_words(build: BuildFolder) -> Markup:
    """The recipe as the user gave it: its path, or for `build --onnx` (whose recipe was
    generated into a folder deleted after the build) the model file it was built from."""
    m = build.manifest
    path = m["recipe"]["path"]
    if ADHOC not in Path(path).parent.parent.name:
        return _h("recipe <code>{}</code>", path)
    sources = [
        str((c.get("source") or {}).get("path") or (c.get("source") or {}).get("ref") or "")
        for c in m["components"].values()
    ]
    shown = ", ".join(s for s in sources if s) or str(m.get("model"))
    return _h("built with <code>winml-recipes build --onnx {}</code>", shown)


def _failure_lead(build: BuildFolder) -> Markup:
    """A failed build's page starts with what failed: the step, the error, the evidence."""
    m = build.manifest
    step = m.get("failing_step") or "a step"
    return _h(
        '<p><span class="verdict fail">build FAILED at {}</span></p><p class="fail">{}</p>'
        '<p class="note">This folder holds the evidence of the failed build (what ran up '
        "to the failing step); nothing in it is deployable.</p>",
        step, m.get("error") or "no error recorded",
    )  # fmt: skip


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
        lead = _h('<p><span class="verdict {}">{}</span></p>', css, verdict)
    m = build.manifest
    random = random_weights_note(m.get("catalog"), m.get("source"))
    if random:
        lead = _join(
            [
                lead,
                _h('<p class="random"><strong>{}.</strong></p>', random[:1].upper() + random[1:]),
            ]
        )
    sections = [
        ("Verdicts and metrics", _verify_section(build)),
        ("Run on a held-out photo", _picture_section(build)),
        ("Per-layer SQNR against float", _layers_section(build, layers, blocked, say)),
        ("Node placement", _placement_section(build)),
        ("Steps: time and peak memory", _steps_section(build)),
        ("Files", _artifacts_section(build)),
        ("Versions", _versions_section(build)),
    ]
    body = _join(_h("<h2>{}</h2>{}", title, content) for title, content in sections)
    page = _h(
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        '<meta http-equiv="Content-Security-Policy" content="{csp}">'
        "<title>{label}: winml-recipes build report</title><style>{css}</style></head><body>"
        "<h1>{label}</h1><p class='note'>model {model}, task {task}, {recipe}, {tool} "
        "{version}</p>{lead}{body}</body></html>\n",
        csp=Markup(CSP), label=build.label, css=Markup(CSS), model=m.get("model"), task=build.task,
        recipe=_recipe_words(build), tool=m["tool"]["name"], version=m["tool"]["version"],
        lead=lead, body=body,
    )  # fmt: skip
    return str(page)


def write_report(
    build_dir: Path,
    layers: bool | None = None,
    budget_mb: float | None = None,
    say: Callable[[str], None] | None = None,
) -> Path:
    """Write BUILD_DIR/report.html (replacing it at once) and return its path."""
    build = open_build(build_dir, contracts=True)
    from winml_recipes.safewrite import write_fresh

    # a fresh file renamed into place: a planted report.html or temp link is never followed
    return write_fresh(build.folder / REPORT, render(build, layers, budget_mb, say))
