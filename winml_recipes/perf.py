"""Time built targets: session creation, latency percentiles, throughput and peak memory.

Every measured row runs in a fresh Python process (`python -m winml_recipes.perf SPEC`), so
session creation includes what a cold app pays (the EP's backend libraries load with the
first session), and the peak resident memory (runtime/memory.py: getrusage's ru_maxrss,
the peak working set on Windows) belongs to that row alone. The process first imports
onnxruntime, registers the EP and reads its inputs; `base_rss_mb` is its peak then, and
`added_rss_mb` what session creation and the runs added on top.

Rows: per component, the uncompiled model and (when the build compiled one and the EP is
the one it was compiled for) the EPContext model; then the whole pipeline on the
deployable models, each component's inputs that an earlier component produces (same
tensor name) taken from that component's outputs in the same iteration. Sessions are the
project's (`open_session`: 2 intra-op threads, sequential, no arena). Inputs are one
seeded synthetic sample per component from the catalog contract, the same for every
build, so targets of one recipe compare on equal inputs.
"""

from __future__ import annotations

import itertools
import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.buildfolder import BuildFolder, BuiltComponent, open_build

DEFAULT_ITERATIONS = 50  # the API's explicit default (the CLI sizes by --budget instead)
DEFAULT_WARMUP = 5
DEFAULT_BUDGET_SECONDS = 60.0  # all rows' warm-up and timed runs, when no count is given
MAX_ITERATIONS = 200  # timed runs per row a budget may buy (P99 needs 100)
TIMEOUT_SECONDS = 3600.0
PIPELINE = "pipeline"
_FEED_NUMBERS = itertools.count()  # the names of feed files in perf's temporary folder
# The fewest runs a percentile needs to be more than the slowest run (nearest rank):
# 1 / (1 - p). Fewer: it is not reported.
MIN_RUNS = {"p50": 2, "p90": 10, "p99": 100}


def emulation_note(ep_key: str) -> str | None:
    """Why times on this EP are not the device's (its plugin says: e.g. an emulator)."""
    from winml_recipes.runtime.providers import get_provider

    return get_provider(ep_key).emulation_note()


def resolve_builds(
    paths: Sequence[Path | str], output_root: Path | str = "build", catalog_dir: Path | None = None
) -> tuple[list[BuildFolder], list[str]]:
    """Build folders from folders and recipes (a recipe: every target built under
    `output_root`); and notes on a recipe's targets that have no build."""
    from winml_recipes.recipe import load_recipe
    from winml_recipes.sdk.errors import ModelFileError

    builds, notes = [], []
    for raw in paths:
        path = Path(raw)
        if path.is_file() and path.suffix in (".yaml", ".yml"):
            recipe = load_recipe(path, catalog_dir=catalog_dir)
            found = 0
            for target in recipe.targets:  # folders: device-precision[-ep] (Target's str)
                folder = Path(output_root) / recipe.name / str(target)
                if (folder / "manifest.json").is_file():
                    builds.append(open_build(folder, catalog_dir))
                    found += 1
                else:
                    notes.append(f"{recipe.name} {target.label}: not built ({folder})")
            if not found:
                raise ModelFileError(
                    f"no target of this recipe is built under {output_root}; run "
                    f"`winml-recipes build {path}` first (or pass -o)",
                    where=str(path),
                )
        else:
            builds.append(open_build(path, catalog_dir))
    return builds, notes


def choose_ep(build: BuildFolder, ep: str | None, device: str | None) -> str:
    """The EP key to time on: `ep`, else `device`'s, else the build target's."""
    from winml_recipes.runtime.providers import get_provider, provider_for_device

    if ep:
        return get_provider(ep).key
    return provider_for_device(device).key if device else build.ep_key


def perf(
    paths: Sequence[Path | str],
    *,
    ep: str | None = None,
    device: str | None = None,
    iterations: int | None = DEFAULT_ITERATIONS,
    warmup: int = DEFAULT_WARMUP,
    output_root: Path | str = "build",
    catalog_dir: Path | None = None,
    seed: int = 0,
    budget_seconds: float = DEFAULT_BUDGET_SECONDS,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time every build in `paths` (see the module docstring); the report as a dict.
    `iterations` None: each row measures one run, then times as many as its share of
    `budget_seconds` holds (at most MAX_ITERATIONS, at least one); `say` hears the
    estimates before and while it runs."""
    from winml_recipes.runtime.providers import availability, get_provider
    from winml_recipes.sdk.errors import ExecutionProviderError, PlanError

    if (iterations is not None and iterations < 1) or warmup < 0 or budget_seconds <= 0:
        raise PlanError("--iterations must be at least 1, --warmup at least 0 and --budget above 0")
    builds, notes = resolve_builds(paths, output_root, catalog_dir)
    keys = [choose_ep(build, ep, device) for build in builds]
    for build, key in zip(builds, keys, strict=True):
        avail = availability(key)
        if not avail.available:
            raise ExecutionProviderError(
                f"{get_provider(key).provider} ({key}) cannot be used here: {avail.reason}; "
                "pass --ep cpu to time on the CPU",
                where=str(build.folder),
            )
    count = sum(_row_count(b, k) for b, k in zip(builds, keys, strict=True))
    share = budget_seconds / max(count, 1)
    tell = say or (lambda _line: None)
    for build, key in zip(builds, keys, strict=True):
        _say_estimate(build, key, tell)
    if iterations is None:
        tell(
            f"perf: {count} rows, a budget of {budget_seconds:.0f} s for their runs "
            f"({share:.1f} s each; --budget SECONDS or --iterations N to change it)"
        )
    plan = {"iterations": iterations, "warmup": warmup, "budget_s": share}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="winml-perf-") as tmp:
        for build, key in zip(builds, keys, strict=True):
            rows += _time_build(build, key, plan, Path(tmp), seed, notes, tell)
    return {
        "host": {"machine": platform.machine(), "system": platform.system()},
        "iterations": iterations,
        "budget_seconds": budget_seconds if iterations is None else None,
        "warmup": warmup,
        "memory": "peak RSS of a fresh process per row; added_rss_mb: what session creation "
        "and the runs added after importing onnxruntime and registering the EP",
        "builds": [
            {
                "build": b.relpath,
                "folder": str(b.folder),
                "device": b.device,
                "precision": b.precision,
            }
            for b in builds
        ],
        "rows": rows,
        "notes": notes,
    }


def _row_count(build: BuildFolder, ep_key: str) -> int:
    """How many rows `_time_build` measures for `build` on `ep_key`."""
    rows = 0
    for comp in build.components:
        rows += (comp.model is not None) + (comp.compiled is not None and ep_key == build.ep_key)
    return rows + (len(build.components) > 1)


def _say_estimate(build: BuildFolder, ep_key: str, say: Callable[[str], None]) -> None:
    """Before any row: what one run costs on the target here, from verify's timing."""
    from winml_recipes.runcost import run_cost

    if ep_key != build.ep_key:
        return
    cost = run_cost(build)
    for line in cost.lines:
        say(f"perf: {build.relpath} {line}")


def _time_build(
    build: BuildFolder,
    ep_key: str,
    plan: dict[str, Any],
    tmp: Path,
    seed: int,
    notes: list[str],
    say: Callable[[str], None],
) -> list[dict[str, Any]]:
    from winml_recipes.onnx.inputs import make_inputs
    from winml_recipes.sdk.errors import ExecutionProviderError

    target_ep = build.ep_key
    emulated = emulation_note(ep_key)
    links = build.upstream_links()
    feeds: dict[str, Path] = {}
    for comp in build.components:
        feed = make_inputs(list(comp.inputs), {}, seed=seed, count=1)[0]
        # numbered: a name from the manifest never becomes part of a path
        feeds[comp.name] = tmp / f"feed-{next(_FEED_NUMBERS)}.npz"
        np.savez(feeds[comp.name], **feed)
    base = {"build": build.relpath, "ep": ep_key, "emulated": emulated is not None}
    if emulated:
        base["note"] = emulated
    rows = []
    deployed: list[BuiltComponent] = []
    for comp in build.components:
        files = [comp.model] if comp.model else []
        if comp.compiled is not None:
            if ep_key == target_ep:
                files.append(comp.compiled)
            else:
                notes.append(
                    f"{build.relpath} {comp.name}: {comp.compiled.name} is compiled for "
                    f"{target_ep}; not timed on {ep_key}"
                )
        if not files:
            raise ExecutionProviderError(
                f"component '{comp.name}' ships only {comp.deployable.name}, compiled for "
                f"{target_ep}; time it with --ep {target_ep}",
                where=str(build.folder),
            )
        deployed.append(comp if files[-1] == comp.deployable else _uncompiled(comp))
        for path in files:
            spec = {"ep": ep_key, **plan, "label": f"{comp.name}/{path.name}",
                    "stages": [{"name": comp.name, "model": str(path),
                                "feed": str(feeds[comp.name]), "links": {}}]}  # fmt: skip
            result = _measure(spec, tmp, say)
            rows.append(_row(base, build, comp.name, [path], result))
    if len(deployed) > 1:
        stages = [
            {"name": c.name, "model": str(c.deployable), "feed": str(feeds[c.name]),
             "links": links[c.name]}
            for c in deployed
        ]  # fmt: skip
        spec = {"ep": ep_key, **plan, "label": PIPELINE, "stages": stages}
        result = _measure(spec, tmp, say)
        paths = [c.deployable for c in deployed]
        rows.append(_row(base, build, PIPELINE, paths, result))
    return rows


def _uncompiled(comp: BuiltComponent) -> BuiltComponent:
    from dataclasses import replace

    return replace(comp, compiled=None)


def _row(
    base: dict[str, Any],
    build: BuildFolder,
    component: str,
    paths: list[Path],
    result: dict[str, Any],
) -> dict[str, Any]:
    times = np.asarray(result["times_ms"], dtype=np.float64)
    files = [p.relative_to(build.folder).as_posix() for p in paths]
    shown = {
        name: round(float(np.percentile(times, int(name[1:]))), 4)
        if len(times) >= MIN_RUNS[name]
        else None  # too few runs to say it
        for name in ("p50", "p90", "p99")
    }
    return {
        **base,
        "component": component,
        "files": files,
        "compiled": all(p.name != "model.onnx" for p in paths),
        "session_create_s": round(sum(result["create_s"]), 4),
        "latency_ms": {
            **shown,
            "mean": round(float(times.mean()), 4),
            "min": round(float(times.min()), 4),
            "max": round(float(times.max()), 4),
        },
        "throughput_per_s": round(1000.0 * len(times) / float(times.sum()), 2),
        "iterations": len(times),
        "warmup": result["warmup"],
        "first_run_s": result["first_run_s"],
        "peak_rss_mb": result["peak_rss_mb"],
        "added_rss_mb": result["added_rss_mb"],
        "placement": result["placement"],
    }


def _measure(
    spec: dict[str, Any], tmp: Path, say: Callable[[str], None] = lambda _line: None
) -> dict[str, Any]:
    """Run one row's measurement in a fresh interpreter; its result as a dict. What the
    worker says while it runs (its first run's time, the runs it chose) goes to `say`."""
    from winml_recipes.sdk.errors import ExecutionProviderError

    spec_path = tmp / "spec.json"
    out_path = tmp / "result.json"
    err_path = tmp / "stderr.txt"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "out": str(out_path)}), encoding="utf-8")
    with err_path.open("w", encoding="utf-8") as err:
        worker = subprocess.Popen(
            [sys.executable, "-m", "winml_recipes.perf", str(spec_path)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert worker.stdout is not None
        started = time.monotonic()
        for line in worker.stdout:
            if line.startswith(SAY):
                say(line[len(SAY) :].rstrip("\n"))
        returncode = worker.wait(timeout=max(1.0, TIMEOUT_SECONDS - (time.monotonic() - started)))
    if returncode != 0 or not out_path.is_file():
        stderr = err_path.read_text(encoding="utf-8", errors="replace")
        lines = stderr.strip().splitlines() or [f"exit code {returncode}"]
        where = spec["stages"][0]["model"] if len(spec["stages"]) == 1 else PIPELINE
        raise ExecutionProviderError(lines[-1].removeprefix("error: "), where=where)
    return json.loads(out_path.read_text(encoding="utf-8"))


SAY = "say: "  # a worker's stdout line for the person watching


def _runs(spec: dict[str, Any], first: float) -> tuple[int, int]:
    """(timed runs, warm-up runs including the first) for a row whose first run took
    `first` seconds: as asked, else what the row's budget holds after the first run (a
    tenth of it for more warm-up, up to the asked warm-up; at least one timed run)."""
    warmup = max(1, int(spec["warmup"]))
    if spec.get("iterations"):
        return int(spec["iterations"]), warmup
    left = max(float(spec["budget_s"]) - first, 0.0)
    per = max(first, 1e-6)
    extra = min(warmup - 1, int(left * 0.1 / per))
    timed = int((left - extra * per) / per)
    return max(1, min(MAX_ITERATIONS, timed)), 1 + extra


def _worker(spec: dict[str, Any]) -> dict[str, Any]:
    """In the fresh process: create the sessions, warm up, time `iterations` runs."""
    from winml_recipes.runtime.memory import peak_rss_mb
    from winml_recipes.runtime.providers import availability
    from winml_recipes.runtime.sessions import open_session

    availability(spec["ep"])  # register the plugin EP before anything is timed
    feeds = []
    for stage in spec["stages"]:
        with np.load(stage["feed"]) as data:
            feeds.append({k: data[k] for k in data.files})
    base = peak_rss_mb()
    sessions, create = [], []
    for stage in spec["stages"]:
        start = time.perf_counter()
        sessions.append(open_session(stage["model"], spec["ep"]))
        create.append(time.perf_counter() - start)

    def once() -> None:
        outputs: dict[str, dict[str, np.ndarray]] = {}
        for stage, session, feed in zip(spec["stages"], sessions, feeds, strict=True):
            feed = dict(feed)
            for name, upstream in stage["links"].items():
                feed[name] = outputs[upstream][name]
            outputs[stage["name"]] = session.run(feed)

    start = time.perf_counter()
    once()  # the first run: a warm-up, and what the row's runs are sized by
    first = time.perf_counter() - start
    iterations, warmup = _runs(spec, first)
    label = spec.get("label", "")
    print(
        f"{SAY}perf: {label}: one run {first:.3g} s; {warmup} warm-up and {iterations} timed "
        f"runs, about {first * (warmup - 1 + iterations):.0f} s",
        flush=True,
    )
    for _ in range(warmup - 1):
        once()
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        once()
        times.append((time.perf_counter() - start) * 1000.0)
    peak = peak_rss_mb()
    placement: dict[str, int] = {}
    for session in sessions:
        for name, count in (session.placement.nodes if session.placement else {}).items():
            placement[name] = placement.get(name, 0) + count
    return {
        "create_s": create,
        "first_run_s": round(first, 4),
        "warmup": warmup,
        "times_ms": times,
        "peak_rss_mb": peak,
        "added_rss_mb": round(peak - base, 1) if peak is not None and base is not None else None,
        "placement": placement,
    }


COMPONENT_WIDTH = 21


def _ms(value: float | None) -> str:
    """A latency in ms in at most 7 columns, whole ("-": too few runs to say it)."""
    if value is None:
        return "-"
    return f"{value:.2f}" if value < 1000 else f"{value:.1f}" if value < 1e5 else f"{value:.0f}"


def format_table(report: dict[str, Any]) -> list[str]:
    """The report as text lines of at most 80 columns: per build and EP a heading, one row
    per measured model (a long component name on a line of its own), the notes below."""
    from winml_recipes.console import fit_all
    from winml_recipes.sdk.ep import shown_name

    header = (
        f"{'component':<{COMPONENT_WIDTH}} {'file':<14} {'create':>6} {'P50 ms':>7} "
        f"{'P90 ms':>7} {'P99 ms':>7} {'peak MB':>7} {'runs':>4}"
    )
    lines = [header, "-" * len(header)]
    last = None
    for row in report["rows"]:
        group = (row["build"], row["ep"])
        if group != last:
            lines.append(f"{row['build']} on {shown_name(row['ep'])}:")
            last = group
        files = {Path(f).name for f in row["files"]}
        file = files.pop() if len(files) == 1 else "mixed"
        lat = row["latency_ms"]
        peak = "-" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.0f}"
        name = row["component"]
        if len(name) > COMPONENT_WIDTH:
            lines.append(name)
            name = ""
        lines.append(
            f"{name:<{COMPONENT_WIDTH}} {file[:14]:<14} {row['session_create_s']:>6.2f} "
            f"{_ms(lat['p50']):>7} {_ms(lat['p90']):>7} {_ms(lat['p99']):>7} "
            f"{peak:>7} {row['iterations']:>4}"
        )
    notes = [f"* {n}" for n in dict.fromkeys(r["note"] for r in report["rows"] if r["emulated"])]
    budget = report.get("budget_seconds")
    runs = (
        f"timed runs sized by a budget of {budget:.0f} s (--budget, --iterations)"
        if budget
        else f"{report['iterations']} timed runs each"
    )
    notes.append(
        f"{runs}, after warm-up, batch 1; create: session creation s; pipeline: every "
        "component per run, on the deployable files"
    )
    notes.append(
        "P90 needs 10 runs, P99 100 (fewer: -); peak MB: a fresh process per row (JSON: "
        "added_rss_mb, throughput, min/mean/max)"
    )
    notes += [f"note: {n}" for n in report["notes"]]
    return lines + fit_all(notes)


def _main(argv: list[str]) -> int:
    from winml_recipes.sdk.errors import WinmlError

    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        result = _worker(spec)
    except WinmlError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    Path(spec["out"]).write_text(json.dumps(result), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
