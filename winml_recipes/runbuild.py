"""`run`: a build folder on inputs a person has (a photo, SAM prompts, an npz), on the
target's EP beside its float reference; writes the outputs, a JSON summary and a picture."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.buildfolder import BuildFolder, open_build
from winml_recipes.outputroot import check_output_root
from winml_recipes.pipeline import PipelineRun, run_float, run_target
from winml_recipes.prompts import (
    BOXES,
    POINTS,
    Box,
    Point,
    default_prompts,
    prompt_feeds,
    takes_prompts,
)
from winml_recipes.safewrite import fresh_folder, save_fresh, write_fresh
from winml_recipes.sdk.errors import RecipeError

RUN_FREE_BYTES = 16 * 2**20  # outputs.npz, summary.json and a PNG
SAMPLE_PHOTO = "rocket_0.jpg"  # the bundled held-out photo `run` and the report default to


def sample_photo() -> Path:
    from winml_recipes.bundled import bundled_images

    photos = bundled_images("heldout")
    return next((p for p in photos if p.name == SAMPLE_PHOTO), photos[0])


def _npz_inputs(path: Path, build: BuildFolder) -> tuple[dict[str, np.ndarray], list[str]]:
    """The arrays of `path`, in the layouts --eval-data takes: one sample, or samples
    stacked on a leading axis (the first is run, and a note says so)."""
    specs = {s.name: s for c in build.components for s in c.contract.inputs}
    known = set(specs)
    headers = _npz_checked(path, build)  # before any array is allocated
    unknown = sorted(set(headers) - known)
    if unknown:
        raise RecipeError(
            f"--npz: {', '.join(unknown)} not an input of the build; "
            f"inputs: {', '.join(sorted(known))}",
            where=str(path),
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            other = sorted(set(data.files) - set(headers))  # not .npy: no header to check
            if other:
                raise RecipeError(
                    f"--npz: {', '.join(other)} not a numpy array; refused", where=str(path)
                )
            arrays = {k: data[k] for k in headers}
    except (OSError, ValueError) as exc:
        raise RecipeError(f"--npz: cannot read it: {exc}", where=str(path)) from None
    stacked = {k: len(a) for k, a in arrays.items() if a.ndim == len(specs[k].shape) + 1}
    if stacked and len(stacked) != len(arrays):
        raise RecipeError(
            f"--npz: {', '.join(sorted(stacked))} carry a sample axis and "
            f"{', '.join(sorted(set(arrays) - set(stacked)))} do not; stack every input alike",
            where=str(path),
        )
    if not stacked:
        return arrays, []
    count = min(stacked.values())
    if count == 0:
        raise RecipeError("--npz: its sample axis is empty", where=str(path))
    note = f"--npz holds {count} samples on a leading axis; ran the first"
    return {k: a[0] for k, a in arrays.items()}, [note]


def _npz_checked(path: Path, build: BuildFolder) -> dict[str, tuple[tuple[int, ...], Any]]:
    """The npz's members from their headers (feeds.npz_headers, as compare reads them): each
    an input of the build with its dtype, shaped as the build takes it (named dims within
    feeds' bounds), optionally stacked (at most feeds.MAX_SAMPLES_PER_FILE); one line else."""
    from winml_recipes.feeds import MAX_SAMPLES_PER_FILE, header_fits, npz_headers
    from winml_recipes.sdk.contract import resolve_shape

    headers = npz_headers(path, "--npz")
    for comp in build.components:
        contract = comp.contract
        for spec in contract.inputs:
            if spec.name not in headers:
                continue
            shape, dtype = headers[spec.name]
            want = resolve_shape(spec, contract.dims)
            if dtype != np.dtype(spec.dtype):
                raise RecipeError(
                    f"--npz: input '{spec.name}' is {dtype}, the build takes {spec.dtype}",
                    where=str(path),
                )
            if not header_fits(shape, want, spec):
                raise RecipeError(
                    f"--npz: input '{spec.name}' has shape {list(shape)}, the build takes "
                    f"{list(want)} (optionally with a leading sample axis of at most "
                    f"{MAX_SAMPLES_PER_FILE}); refused before reading it",
                    where=str(path),
                )
    return headers


def prepare_inputs(
    build: BuildFolder,
    image: Path | None,
    points: Sequence[Point],
    boxes: Sequence[Box],
    npz: Path | None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The pipeline's inputs and what they were (for the summary and the picture)."""
    from winml_recipes.images import load_rgb, preprocess_image

    inputs, notes = _npz_inputs(npz, build) if npz else ({}, [])
    about: dict[str, Any] = {"notes": notes}
    found = build.image_input()
    frame_hw: tuple[int, int] | None = None
    image_wh: tuple[int, int] | None = None
    if found is not None:
        _, spec = found
        assert spec.image is not None
        frame_hw = spec.image.size
        if spec.name not in inputs:
            if image is None:
                image = sample_photo()
                about["notes"].append(f"no --image: the bundled held-out photo {image.name}")
            inputs[spec.name] = preprocess_image(Path(image), spec)
    elif image is not None:
        raise RecipeError(f"--image: {build.label} has no image input (pass --npz)")
    if image is not None:
        image_wh = load_rgb(Path(image)).size
        about["image"] = str(image)
        about["image_size"] = list(image_wh)
    prompted = [c for c in build.components if takes_prompts([s.name for s in c.contract.inputs])]
    if (points or boxes) and not prompted:
        raise RecipeError(f"--point/--box: {build.label} takes no prompts")
    if prompted and POINTS not in inputs:
        comp = prompted[0]
        frame = frame_hw or image_wh
        if frame is None:
            raise RecipeError("--point/--box need --image (or put input_points in --npz)")
        wh = image_wh or (frame[1], frame[0])
        prompts = default_prompts(points, boxes, wh)
        about["notes"] += list(prompts.notes)
        shape = comp.input_shape(POINTS) or ()
        box_shape = comp.input_shape(BOXES) or ()
        inputs |= prompt_feeds(
            prompts,
            wh,
            frame,
            shape[2] if len(shape) > 2 else None,
            box_shape[1] if len(box_shape) > 1 else 1,
        )
        sx, sy = frame[1] / wh[0], frame[0] / wh[1]
        about["points"] = [
            {"x": p.x, "y": p.y, "label": p.label, "model_xy": [p.x * sx, p.y * sy]}
            for p in prompts.points
        ]
        about["boxes"] = [[b.x1, b.y1, b.x2, b.y2] for b in prompts.boxes]
        about["model_frame"] = list(frame)
    return inputs, about


def compare_pipelines(build: BuildFolder, ref: PipelineRun, cand: PipelineRun) -> dict[str, Any]:
    """Per component output SQNR/cosine/max_abs, and the task metric where one applies."""
    from winml_recipes.onnx.metrics import compare_runs
    from winml_recipes.sdk.metrics import metric_for

    out: dict[str, Any] = {"components": {}}
    for comp in build.components:
        metrics = compare_runs([ref.outputs[comp.name]], [cand.outputs[comp.name]])
        out["components"][comp.name] = {
            name: {k: m[k] for k in ("sqnr_db", "cosine", "max_abs")} for name, m in metrics.items()
        }
        metric = metric_for(build.task, comp.contract)
        if metric is not None:
            used = metric.outputs_used(comp.contract) or ()
            values = metric.values(
                [{n: ref.outputs[comp.name][n] for n in used}],
                [{n: cand.outputs[comp.name][n] for n in used}],
            )
            out["task_metric"] = {
                "component": comp.name, "task": build.task, "metric": metric.name, "values": values,
            }  # fmt: skip
    return out


@dataclass
class RunOutcome:
    summary: dict[str, Any]
    float_run: PipelineRun | None  # None: the build ships the float model itself
    target_run: PipelineRun


def run_build(build_dir: Path | str, **kwargs: Any) -> dict[str, Any]:
    """`run_and_write`'s summary."""
    return run_and_write(build_dir, **kwargs).summary


def run_and_write(
    build_dir: Path | str,
    *,
    image: Path | str | None = None,
    points: Sequence[Point] = (),
    boxes: Sequence[Box] = (),
    npz: Path | str | None = None,
    output_dir: Path | str | None = None,
    compiled: bool | None = None,
    picture: bool = True,
    say: Callable[[str], None] | None = None,
) -> RunOutcome:
    """Run the build's pipeline on the target and the float one; write `outputs.npz`,
    `summary.json` and (image tasks) a PNG into `output_dir` (default BUILD_DIR/run).
    Before it starts, `say` hears what the run costs on the target (runcost.py); what the
    emulated target cannot run in time here runs on the CPU simulation, said in the notes."""
    from winml_recipes.pictures import draw_run
    from winml_recipes.runcost import run_cost

    build = open_build(build_dir, contracts=True)
    out = Path(output_dir) if output_dir else build.folder / "run"
    # before any line is said: a file, read-only or full disk fails here, in one line
    check_output_root(out, least_bytes=RUN_FREE_BYTES, label="-o" if output_dir else "run folder")
    inputs, about = prepare_inputs(
        build,
        Path(image) if image else None,
        points,
        boxes,
        Path(npz) if npz else None,
    )
    cost = run_cost(build, compiled)  # said once the inputs are known good
    if say is not None:
        for line in cost.lines:
            say(f"run: {line}")
    target = run_target(build, inputs, compiled, simulate=cost.simulate)
    about["notes"] += [f"{c}: ran on the CPU simulation (verify did too)" for c in cost.simulate]
    has_float = any(c.reference is not None for c in build.components)
    ref = run_float(build, inputs) if has_float else None
    out = fresh_folder(out)
    summary: dict[str, Any] = {
        "build": str(build.folder),
        "target": dict(build.manifest["target"]),  # device, precision[, ep]
        **about,
        "target_run": target.ran_on,
    }
    arrays = {f"target/{c}/{n}": v for c, outs in target.outputs.items() for n, v in outs.items()}
    if ref is not None:
        summary["float_run"] = ref.ran_on
        summary |= compare_pipelines(build, ref, target)
        arrays |= {f"float/{c}/{n}": v for c, outs in ref.outputs.items() for n, v in outs.items()}
    else:
        summary["notes"].append("the build ships the float model itself: nothing to compare")
    save_fresh(out / "outputs.npz", lambda handle: np.savez(handle, **arrays))
    summary["outputs"] = str(out / "outputs.npz")
    if picture and about.get("image"):
        stem = Path(about["image"]).stem
        drawn = draw_run(
            build, Path(about["image"]), about, ref, target, summary, out / f"{stem}.png"
        )
        if drawn is not None:
            summary["picture"] = str(drawn)
    write_fresh(out / "summary.json", json.dumps(summary, indent=2, default=_jsonable) + "\n")
    return RunOutcome(summary, ref, target)


def _jsonable(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    return str(value)
