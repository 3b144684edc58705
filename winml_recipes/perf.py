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

import json
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.buildfolder import BuildFolder, BuiltComponent, open_build

DEFAULT_ITERATIONS = 50
DEFAULT_WARMUP = 5
TIMEOUT_SECONDS = 3600.0
PIPELINE = "pipeline"


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
    iterations: int = DEFAULT_ITERATIONS,
    warmup: int = DEFAULT_WARMUP,
    output_root: Path | str = "build",
    catalog_dir: Path | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Time every build in `paths` (see the module docstring); the report as a dict."""
    from winml_recipes.runtime.providers import availability, get_provider
    from winml_recipes.sdk.errors import ExecutionProviderError, PlanError

    if iterations < 1 or warmup < 0:
        raise PlanError("--iterations must be at least 1 and --warmup at least 0")
    builds, notes = resolve_builds(paths, output_root, catalog_dir)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="winml-perf-") as tmp:
        for build in builds:
            key = choose_ep(build, ep, device)
            avail = availability(key)
            if not avail.available:
                raise ExecutionProviderError(
                    f"{get_provider(key).provider} ({key}) cannot be used here: {avail.reason}; "
                    "pass --ep cpu to time on the CPU",
                    where=str(build.folder),
                )
            rows += _time_build(build, key, iterations, warmup, Path(tmp), seed, notes)
    return {
        "host": {"machine": platform.machine(), "system": platform.system()},
        "iterations": iterations,
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


def _time_build(
    build: BuildFolder,
    ep_key: str,
    iterations: int,
    warmup: int,
    tmp: Path,
    seed: int,
    notes: list[str],
) -> list[dict[str, Any]]:
    from winml_recipes.onnx.inputs import make_inputs
    from winml_recipes.sdk.errors import ExecutionProviderError

    target_ep = build.ep_key
    emulated = emulation_note(ep_key)
    links = build.upstream_links()
    feeds: dict[str, Path] = {}
    for comp in build.components:
        feed = make_inputs(list(comp.inputs), {}, seed=seed, count=1)[0]
        feeds[comp.name] = tmp / f"{build.relpath.replace('/', '-')}-{comp.name}.npz"
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
            spec = {"ep": ep_key, "iterations": iterations, "warmup": warmup,
                    "stages": [{"name": comp.name, "model": str(path),
                                "feed": str(feeds[comp.name]), "links": {}}]}  # fmt: skip
            result = _measure(spec, tmp)
            rows.append(_row(base, build, comp.name, [path], result, iterations, warmup))
    if len(deployed) > 1:
        stages = [
            {"name": c.name, "model": str(c.deployable), "feed": str(feeds[c.name]),
             "links": links[c.name]}
            for c in deployed
        ]  # fmt: skip
        spec = {"ep": ep_key, "iterations": iterations, "warmup": warmup, "stages": stages}
        result = _measure(spec, tmp)
        paths = [c.deployable for c in deployed]
        rows.append(_row(base, build, PIPELINE, paths, result, iterations, warmup))
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
    iterations: int,
    warmup: int,
) -> dict[str, Any]:
    times = np.asarray(result["times_ms"], dtype=np.float64)
    p50, p90, p99 = (float(v) for v in np.percentile(times, [50, 90, 99]))
    files = [p.relative_to(build.folder).as_posix() for p in paths]
    return {
        **base,
        "component": component,
        "files": files,
        "compiled": all(p.name != "model.onnx" for p in paths),
        "session_create_s": round(sum(result["create_s"]), 4),
        "latency_ms": {
            "p50": round(p50, 4),
            "p90": round(p90, 4),
            "p99": round(p99, 4),
            "mean": round(float(times.mean()), 4),
            "min": round(float(times.min()), 4),
            "max": round(float(times.max()), 4),
        },
        "throughput_per_s": round(1000.0 * len(times) / float(times.sum()), 2),
        "iterations": iterations,
        "warmup": warmup,
        "peak_rss_mb": result["peak_rss_mb"],
        "added_rss_mb": result["added_rss_mb"],
        "placement": result["placement"],
    }


def _measure(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """Run one row's measurement in a fresh interpreter; its result as a dict."""
    from winml_recipes.sdk.errors import ExecutionProviderError

    spec_path = tmp / "spec.json"
    out_path = tmp / "result.json"
    out_path.unlink(missing_ok=True)
    spec_path.write_text(json.dumps({**spec, "out": str(out_path)}), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "winml_recipes.perf", str(spec_path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
    )
    if done.returncode != 0 or not out_path.is_file():
        lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
        where = spec["stages"][0]["model"] if len(spec["stages"]) == 1 else PIPELINE
        raise ExecutionProviderError(lines[-1].removeprefix("error: "), where=where)
    return json.loads(out_path.read_text(encoding="utf-8"))


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

    for _ in range(spec["warmup"]):
        once()
    times = []
    for _ in range(spec["iterations"]):
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
        "times_ms": times,
        "peak_rss_mb": peak,
        "added_rss_mb": round(peak - base, 1) if peak is not None and base is not None else None,
        "placement": placement,
    }


def format_table(report: dict[str, Any]) -> list[str]:
    """The report as text lines: one row per measured model, the notes below."""
    header = (
        f"{'target':<12} {'component':<27} {'file':<15} {'EP':<9} {'create s':>8} "
        f"{'P50 ms':>8} {'P90 ms':>8} {'P99 ms':>8} {'runs/s':>8} {'peak MB':>8} {'+MB':>6}"
    )
    lines = [header, "-" * len(header)]
    last = None
    for row in report["rows"]:
        target = row["build"].split("/", 1)[-1]
        shown = target if target != last else ""
        last = target
        files = {Path(f).name for f in row["files"]}
        file = files.pop() if len(files) == 1 else "mixed"
        ep = row["ep"] + ("*" if row["emulated"] else "")
        lat = row["latency_ms"]
        peak = "-" if row["peak_rss_mb"] is None else f"{row['peak_rss_mb']:.0f}"
        added = "-" if row["added_rss_mb"] is None else f"{row['added_rss_mb']:.0f}"
        lines.append(
            f"{shown:<12} {row['component'][:27]:<27} {file[:15]:<15} {ep:<9} "
            f"{row['session_create_s']:>8.3f} {lat['p50']:>8.2f} {lat['p90']:>8.2f} "
            f"{lat['p99']:>8.2f} {row['throughput_per_s']:>8.1f} "
            f"{peak:>8} {added:>6}"
        )
    for note in dict.fromkeys(r["note"] for r in report["rows"] if r["emulated"]):
        lines.append(f"* {note}")
    lines.append(
        f"{report['iterations']} timed runs after {report['warmup']} warm-up runs, batch 1; "
        "pipeline: every component per run, on the deployable files"
    )
    lines.append("peak MB: a fresh process per row; +MB: added by session creation and the runs")
    lines += [f"note: {n}" for n in report["notes"]]
    return lines


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
