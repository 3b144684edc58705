"""Write a catalog entry and a recipe for a model file (used by `build --onnx`).

The generated YAML goes through the normal loader and validator, so a build from a bare
ONNX file takes exactly the same code path as a build from a curated recipe.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from winml_recipes.sdk.contract import TensorSpec
from winml_recipes.sdk.errors import CatalogError, RecipeError
from winml_recipes.untrusted import printable


def parse_shapes(items: tuple[str, ...] | list[str]) -> dict[str, tuple[int, ...]]:
    """`--shape name=1x3x224x224` options."""
    out: dict[str, tuple[int, ...]] = {}
    for item in items:
        name, sep, dims = item.partition("=")
        if not sep or not name or not re.fullmatch(r"\d+(x\d+)*", dims):
            raise RecipeError(
                f"--shape '{item}': expected NAME=DxDx... (e.g. pixel_values=1x3x224x224)"
            )
        if name in out:
            raise RecipeError(f"--shape {name}: given twice; keep one")
        shape = tuple(int(d) for d in dims.split("x"))
        if 0 in shape:
            raise RecipeError(f"--shape '{item}': dims must be at least 1")
        out[name] = shape
    return out


def unset_dims(specs: list[TensorSpec], set_dims: set[str]) -> dict[str, list[str]]:
    """Per input, its dynamic dims that nothing set and whose value would be a guess.

    Batch-like names (batch, N, ...) default to 1 safely; any other dim (H, W, sequence,
    a converter's `p2o.DynamicDimension.0`) must be given: a 1x1-pixel image model that
    "verifies" is worse than an error.
    """
    out: dict[str, list[str]] = {}
    for spec in specs:
        missing = [
            d for d in spec.shape
            if isinstance(d, str) and d not in set_dims and not OBVIOUS_DIMS.match(d)
        ]  # fmt: skip
        if missing:
            out[spec.name] = missing
    return out


def _dims_from_shapes(
    specs: list[TensorSpec], dims: dict[str, int], shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, int]:
    by_name = {s.name: s for s in specs}
    set_by: dict[str, str] = {}  # named dim -> the --shape that set it
    for name, shape in shapes.items():
        spec = by_name.get(name)
        if spec is None:
            raise RecipeError(
                f"--shape {name}: the model has no input '{name}'; inputs: {', '.join(by_name)}"
            )
        if len(shape) != len(spec.shape):
            raise RecipeError(
                f"--shape {name}: {len(shape)} dims given, the input has "
                f"{len(spec.shape)} ({list(spec.shape)})"
            )
        for want, got in zip(spec.shape, shape, strict=True):
            if isinstance(want, int) and want != got:
                raise RecipeError(f"--shape {name}: dim of size {want} cannot be {got}")
            if isinstance(want, str):
                if want in set_by and dims[want] != got:
                    raise RecipeError(
                        f"--shape {name}: dim '{want}' is {got} here but {dims[want]} in "
                        f"--shape {set_by[want]}; give it one value"
                    )
                dims[want], set_by[want] = got, name
    return dims


def _identifier(text: str) -> str:
    out = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return out if re.match(r"[A-Za-z_]", out) else f"_{out}"


def _tensor(spec: TensorSpec) -> dict:
    out: dict = {"dtype": spec.dtype, "shape": list(spec.shape)}
    if spec.range is not None:
        out["range"] = [float(spec.range[0]), float(spec.range[1])]
    if spec.values is not None:
        out["values"] = list(spec.values)
    if spec.image is not None:
        out["image"] = {
            "size": list(spec.image.size),
            "mean": list(spec.image.mean),
            "std": list(spec.image.std),
            "layout": spec.image.layout,
        }
    return out


def onnx_entry(
    model_path: Path, name: str, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[dict, dict[str, int]]:
    """A catalog entry (plain data) with one component, `model`, read from the graph."""
    from winml_recipes.onnx.digest import value_info_dict
    from winml_recipes.onnx.inputs import dim_names, specs_from_model
    from winml_recipes.onnx.io import load_model
    from winml_recipes.tasks import guess_task

    model = load_model(model_path, load_external_data=False)
    specs, dims = specs_from_model(model)
    dims = _dims_from_shapes(specs, dims, shapes)
    names = dim_names(model)
    outputs = {}
    for vi in model.graph.output:
        shape = value_info_dict(vi)["shape"] or []
        outputs[vi.name] = {
            "shape": [
                names.get((vi.name, i), f"{_identifier(vi.name)}_dim{i}")
                if not isinstance(d, int) or d <= 0
                else d
                for i, d in enumerate(shape)
            ],
            # files declare output shapes that do not hold (ddddocr's recognizer: [1, seqlen]
            # declared, [24, 1, 8210] computed); verify trusts the float model's run
            "shape_advisory": True,
        }
    inputs = {s.name: _tensor(s) for s in specs}
    task, _why = guess_task(inputs, outputs, dims)
    entry = {
        "schema_version": 1,
        "name": name,
        "task": task,
        "license": "unknown",
        "description": f"Generated from {model_path.name}",
        "components": {
            "model": {
                "source": {"ref": str(model_path.resolve())},
                "dims": dims,
                "inputs": inputs,
                "outputs": outputs,
            }
        },
    }
    return entry, dims


def entry_name(text: str) -> str:
    """A catalog/recipe name from a file or folder name: other characters become `-`, and
    it starts with a letter or digit (`.hidden.onnx` is the entry `hidden`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", text).lstrip("._-") or "model"


def write_adhoc_project(
    model_path: Path,
    root: Path,
    device: str,
    precision: str,
    shapes: Mapping[str, tuple[int, ...]],
    calibration_data: str | None = None,
    eval_data: str | None = None,
    allow_calibration_overlap: bool = False,
    task: str | None = None,
) -> tuple[Path, str]:
    """root/catalog/NAME.yaml + root/recipes/NAME.yaml for one target; returns the recipe.

    Every dynamic dim needs a value from --shape (batch-like dims default to 1). Data (an
    npz glob, an image folder or a saved `datasets` split): calibration reads
    `calibration_data`, verification `eval_data` (never calibration samples; seeded
    synthetic inputs when none is given).
    """
    name = entry_name(model_path.stem)
    entry, _ = onnx_entry(model_path, name, shapes)
    specs = [
        TensorSpec(n, t["dtype"], tuple(t["shape"]))
        for n, t in entry["components"]["model"]["inputs"].items()
    ]
    data = {CALIBRATION_FLAG: calibration_data, EVAL_FLAG: eval_data}
    data = {flag: value for flag, value in data.items() if value is not None}
    for flag, value in data.items():  # a wrong key is named before any dim is read
        check_npz_names(specs, value, flag)
    given = {d for s in specs if s.name in shapes for d in s.shape if isinstance(d, str)}
    missing = unset_dims(specs, given)
    read: dict[str, tuple[int, ...]] = {}
    if missing and calibration_data is not None:
        # The data knows the sizes the model runs at (a sequence length, an image side).
        read = dims_from_npz(specs, missing, calibration_data, entry["components"]["model"]["dims"])
        if read:
            entry, _ = onnx_entry(model_path, name, {**read, **shapes})
            given |= {d for s in specs if s.name in read for d in s.shape if isinstance(d, str)}
            missing = unset_dims(specs, given)
    if missing:
        listed = "; ".join(f"{n}: {', '.join(ds)}" for n, ds in missing.items())
        first = next(s for s in specs if s.name in missing)
        example = "x".join(str(d) if isinstance(d, int) else "N" for d in first.shape)
        raise RecipeError(
            f"dims with no value ({listed}); give each input's shape, e.g. --shape "
            f"{first.name}={example} with N replaced by the sizes the model runs at",
            where=str(model_path),
        )
    check_data_against_model(entry, data)
    if task is not None:
        entry["task"] = task
    (root / "catalog").mkdir(parents=True, exist_ok=True)
    (root / "recipes").mkdir(exist_ok=True)
    (root / "catalog" / f"{name}.yaml").write_text(yaml.safe_dump(entry, sort_keys=False))
    recipe = {
        "schema_version": 1,
        "name": name,
        "model": name,
        # The recipe is a template: the model's path (any characters, `{{` included) stays
        # in the catalog entry, which is plain YAML; only the sanitized name appears here.
        "description": f"Ad-hoc build of {name} from the presets",
        "targets": [{"device": device, "precision": precision}],
    }
    if calibration_data is not None or eval_data is not None:
        recipe["steps"] = _steps_with_data(
            device, precision, calibration_data, eval_data, allow_calibration_overlap
        )
    path = root / "recipes" / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    note = task_line(entry, given=task is not None)
    if read:  # the model is built at the data's size: said, with how to choose another
        sizes = ", ".join(f"{n}={'x'.join(map(str, v))}" for n, v in read.items())
        note += (
            f"\nshapes: {sizes}, read from {Path(calibration_data or '').name} "
            "(the model leaves them open); --shape to choose"
        )
    return path, note


CALIBRATION_FLAG, EVAL_FLAG = "--calibration-data", "--eval-data"


def check_npz_names(specs: list[TensorSpec], data: str, flag: str) -> None:
    """Every npz file of `data` holds an array for every model input (checked before any dim
    is read from it: a wrong key is named, not reported as a missing --shape)."""
    from winml_recipes.feeds import npz_files, npz_headers
    from winml_recipes.sdk.errors import PlanError

    option = _data_option(data)
    if "npz" not in option:
        return
    path = Path(option["npz"])
    for file in npz_files(path.name, path.parent, flag):
        headers = npz_headers(file, flag)
        absent = [s for s in specs if s.name not in headers]
        if absent:
            wanted = ", ".join(f"'{s.name}' {s.dtype}{list(s.shape)}" for s in absent)
            raise PlanError(
                f"{flag}: {file.name} has no array named {wanted}, an input of the model "
                f"(it has: {', '.join(map(repr, headers)) or 'nothing'}); save the arrays "
                "under the model's input names"
            )


def check_data_against_model(entry: dict, data: Mapping[str, str]) -> None:
    """Each npz of `data` ({flag: value}) against the model at the size it will be built
    (every key, dtype and shape, the sample axis; named dims at their value, since the
    build fixes them), and its float values finite and sane: before any step runs."""
    from winml_recipes.feeds import check_npz, check_npz_values, npz_files
    from winml_recipes.sdk.contract import IOContract

    comp = entry["components"]["model"]
    specs = tuple(TensorSpec(n, t["dtype"], tuple(t["shape"])) for n, t in comp["inputs"].items())
    contract = IOContract(specs, (), dict(comp["dims"]))
    for flag, value in data.items():
        option = _data_option(value)
        if "npz" not in option:
            continue
        path = Path(option["npz"])
        files = npz_files(path.name, path.parent, flag)
        check_npz(files, contract, flag, exact_dims=True)
        check_npz_values(files, contract, flag)


def task_line(entry: dict, given: bool = False, change: str = "--task") -> str:
    """One line: the task a generated entry says and the metric verify will judge it by."""
    from winml_recipes.sdk.contract import IOContract, TensorSpec
    from winml_recipes.sdk.metrics import metric_for
    from winml_recipes.tasks import guess_task

    task = entry["task"]
    judged = []
    for cname, comp in entry["components"].items():
        outputs = comp.get("outputs") or {}
        specs = tuple(
            TensorSpec(n, "float32", tuple(o.get("shape", ()))) for n, o in outputs.items()
        )
        metric = metric_for(task, IOContract(outputs=specs))
        judged.append(f"{cname} by {metric.name}" if metric else f"{cname} by per-output gates")
    comp = entry["components"].get("model", {})
    if given:
        why = "as given"
    elif "inputs" in comp and "outputs" in comp and "family" not in entry:
        why = guess_task(comp["inputs"], comp["outputs"], comp.get("dims"))[1]
    else:
        why = "from the model's config"
    return f"task: {task} ({why}); verify judges {', '.join(judged)}; {change} to change"


def synthetic_calibration_note(model_path: Path, precision: str) -> str | None:
    """One line for a build that calibrates image or token-id inputs on synthetic values
    (their activation ranges are not the ranges real data gives), else None. A model with
    one image input calibrates on the bundled photographs instead (the summary says so)."""
    from winml_recipes.presets import precision_settings

    if precision_settings(precision).get("kind") != "integer":
        return None
    entry, _ = onnx_entry(model_path, "model", {})
    inputs = entry["components"]["model"]["inputs"]
    images = [n for n, t in inputs.items() if "image" in t]
    tokens = [n for n, t in inputs.items() if "values" not in t and t["dtype"].startswith("int")]
    # one image input calibrates on the bundled photographs; several cannot
    looks = [f"{n} (image)" for n in images if len(images) > 1]
    looks += [f"{n} (token ids)" for n in tokens]
    if not looks:
        return None
    return (
        f"note: calibrating {', '.join(looks)} on synthetic inputs; ranges on real data differ. "
        "Pass real samples: --calibration-data calib.npz (or an image folder) and "
        "--eval-data heldout.npz"
    )


SYNTHETIC_GATE_HINT = (
    "; likely cause: the model was calibrated on synthetic inputs: pass real samples with "
    "--calibration-data (and --eval-data)"
)


def dims_from_npz(
    specs: list[TensorSpec],
    missing: Mapping[str, list[str]],
    data: str,
    dims: Mapping[str, int],
) -> dict[str, tuple[int, ...]]:
    """`--shape` values for the inputs with unset dims, read from the first `.npz` file of
    `data` (array headers only): a sample's shape, the leading sample axis removed.

    Only dims nothing set are taken from the data; the others keep their value (`dims`), so
    an `(8, 32)` array for `[batch, sequence]` still meets the npz ambiguity check.
    """
    from winml_recipes.feeds import npz_files, npz_headers

    if Path(data).is_dir() or "dataset" in _data_option(data):
        return {}
    path = Path(data)
    headers = npz_headers(npz_files(path.name, path.parent, CALIBRATION_FLAG)[0], CALIBRATION_FLAG)
    out: dict[str, tuple[int, ...]] = {}
    for spec in specs:
        if spec.name not in missing or spec.name not in headers:
            continue
        shape = headers[spec.name][0]
        if len(shape) == len(spec.shape) + 1:
            shape = shape[1:]
        if len(shape) != len(spec.shape) or 0 in shape:
            continue  # the npz check says what is wrong with it
        out[spec.name] = tuple(
            dims.get(d, 1) if isinstance(d, str) and d not in missing[spec.name] else int(g)
            for d, g in zip(spec.shape, shape, strict=True)
        )
    return out


def _data_option(data: str) -> dict[str, str]:
    """{"dataset": folder[:split]} for a folder saved by `datasets` (by its dataset_info.json
    or dataset_dict.json), {"images": folder} for another directory, else {"npz": glob}, as
    an absolute path."""
    from winml_recipes.hfdata import is_dataset_dir, split_spec

    folder, split = split_spec(data, Path.cwd())
    if is_dataset_dir(folder):
        return {"dataset": str(folder.resolve()) + (f":{split}" if split else "")}
    path = Path(data)
    if path.is_dir():
        return {"images": str(path.resolve())}
    return {"npz": str(path.parent.resolve() / path.name)}


def _steps_with_data(
    device: str,
    precision: str,
    calibration: str | None,
    held_out: str | None,
    allow_overlap: bool = False,
) -> list:
    """The preset steps, calibrating on `calibration` and verifying on `held_out`."""
    from winml_recipes.presets import default_steps, resolve_target

    steps = []
    for step in default_steps(resolve_target(device, precision)):
        name, options = (step, {}) if isinstance(step, str) else next(iter(step.items()))
        if name == "quantize" and calibration is not None:
            options = {**options, "calibration": _data_option(calibration)}
            if held_out is not None and options.get("algorithms") == "auto":
                # `algorithms: auto` scores its candidates on the held-out data too
                options["algorithms"] = _data_option(held_out)
        if name == "quantize" and held_out is not None and options.get("mode") == "auto":
            # so does `mode: auto`, unless that data may hold calibration samples
            if not allow_overlap:
                options = {**options, "held_out": _data_option(held_out)}
        elif name == "verify" and held_out is not None:
            options = {**options, **_data_option(held_out)}
            if allow_overlap:
                options["allow_calibration_overlap"] = True
        steps.append({name: options} if options else name)
    return steps


# Dims whose value 1 is a safe guess; any other dynamic dim gets a TODO in `init` output.
OBVIOUS_DIMS = re.compile(r"^(batch|batch_size|n|num_batches|b|N)$", re.IGNORECASE)
INIT_TARGETS = [("cpu", "fp32"), ("npu", "w8a16"), ("cpu", "int8"), ("gpu", "fp16")]
# SAM-style two-component models: targets and steps (the decoder calibrated and verified on
# the float encoder's embeddings of the bundled photos) from this packaged partial.
SAM_STEPS = "sam-components.yaml"
SAM_TARGETS = [("cpu", "fp32"), ("npu", "w8a16"), ("cpu", "int8")]


def _with_todos(text: str, dims: Mapping[str, int]) -> str:
    out = []
    for line in text.splitlines():
        stripped = line.strip()
        key = stripped.split(":", 1)[0]
        if key in dims and not OBVIOUS_DIMS.match(key) and stripped == f"{key}: {dims[key]}":
            line += "  # TODO: guessed; set a typical value"
        out.append(line)
    return "\n".join(out) + "\n"


def init_project(
    ref: str, *, name: str | None, catalog_dir: Path, recipes_dir: Path
) -> tuple[Path, Path]:
    """Write a starting catalog entry and recipe for a model reference; never overwrite."""
    from winml_recipes.sources import HfModelId, HubOnnx, LocalHfDir, LocalOnnx, classify

    model_ref = classify(ref)
    if isinstance(model_ref, LocalHfDir | HfModelId):
        return _init_export_project(model_ref, ref, name, catalog_dir, recipes_dir)
    if isinstance(model_ref, LocalOnnx):
        if not model_ref.path.is_file():
            raise RecipeError(f"init: file not found: {model_ref.path}")
        model_path, revision = model_ref.path, None
        source_ref = _relative_ref(model_ref.path, catalog_dir)
    elif isinstance(model_ref, HubOnnx):
        from winml_recipes.hub import download_onnx

        fetched = download_onnx(model_ref)
        model_path, source_ref, revision = (
            fetched.path,
            f"{model_ref.repo_id}/{model_ref.filename}",
            fetched.commit,
        )
    else:
        raise RecipeError(
            f"init: '{ref}' is a catalog name; give a local .onnx path, a Hub ONNX ref "
            "org/repo/path.onnx, an HF model id org/model or a local HF directory"
        )
    name = name or entry_name(model_path.stem)
    entry, dims = onnx_entry(model_path, name, {})
    source = {"ref": source_ref} | ({"revision": revision} if revision else {})
    entry["components"]["model"]["source"] = source
    entry["description"] = f"Generated by winml-recipes init from {ref}"
    return _write_init(entry, dims, ref, catalog_dir, recipes_dir)


def _write_init(
    entry: dict,
    dims: Mapping[str, int],
    ref: str,
    catalog_dir: Path,
    recipes_dir: Path,
    made_from: Path | None = None,
    steps: str | None = None,
) -> tuple[Path, Path]:
    """Write the entry and its recipe, after checking the entry the way `validate` will
    (`made_from`: the file the entry was read from, named when it is not valid; `steps`: a
    partial that gives the recipe's components, else the presets give the steps)."""
    from winml_recipes.catalog import entry_from_text

    name = entry["name"]
    catalog_path = catalog_dir / f"{name}.yaml"
    recipe_path = recipes_dir / f"{name}.yaml"
    for path in (catalog_path, recipe_path):
        if path.exists():
            raise RecipeError(f"init: {path} exists; init never overwrites (choose --name)")
    body = _with_todos(yaml.safe_dump(entry, sort_keys=False), dims)
    try:
        entry_from_text(body, catalog_path)
    except CatalogError as exc:
        raise RecipeError(
            f"init: {printable(made_from or ref)} does not give a valid catalog entry "
            f"({printable(exc.message)[:200]}); nothing written, fix the model's files"
        ) from None
    schemas = _project_schemas(catalog_dir.parent)
    catalog_text = (
        f"# yaml-language-server: $schema={_relative(schemas['catalog'], catalog_dir)}\n" + body
    )
    recipe = {
        "schema_version": 1,
        "name": name,
        "model": name,
        "description": f"Generated by winml-recipes init from {ref}; steps come from "
        + (f"the {steps} partial" if steps else "the presets"),
    }
    targets = SAM_TARGETS if steps else INIT_TARGETS
    recipe["targets"] = [{"device": d, "precision": p} for d, p in targets]
    recipe_text = (
        f"# yaml-language-server: $schema={_relative(schemas['recipe'], recipes_dir)}\n"
        + yaml.safe_dump(recipe, sort_keys=False)
        + (f'{{% include "{steps}" %}}\n' if steps else "")
    )
    catalog_dir.mkdir(parents=True, exist_ok=True)
    recipes_dir.mkdir(parents=True, exist_ok=True)
    catalog_path.write_text(catalog_text)
    recipe_path.write_text(recipe_text)
    return catalog_path, recipe_path


def next_commands(catalog_path: Path, recipe_path: Path) -> list[str]:
    """The commands that validate and build what `init` wrote, run from the same folder
    (`--catalog` when the entry is not in the catalog/ beside the recipes/ folder)."""
    catalog_dir = catalog_path.parent
    beside = recipe_path.parent.parent / "catalog"
    flag = [] if beside.resolve() == catalog_dir.resolve() else ["--catalog", str(catalog_dir)]
    return [
        _command_line(["winml-recipes", command, str(recipe_path), *flag])
        for command in ("validate", "build")
    ]


def _command_line(args: list[str]) -> str:
    """Quoted for the shell the user is in (cmd.exe rules on Windows)."""
    if os.name == "nt":
        import subprocess

        return subprocess.list2cmdline(args)
    import shlex

    return shlex.join(args)


def _project_schemas(root: Path) -> dict[str, Path]:
    """root/schemas/{recipe,catalog}.schema.json, written when missing, so the `$schema`
    comments resolve in any project folder (not only in this repository)."""
    from winml_recipes.schemas import render

    out = {}
    for kind in ("recipe", "catalog"):
        path = root / "schemas" / f"{kind}.schema.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render(kind))  # the same text as `schema --write`
        out[kind] = path
    return out


def _relative(target: Path, start: Path) -> str:
    return Path(os.path.relpath(target.resolve(), start.resolve())).as_posix()


def _init_export_project(
    model_ref, ref: str, name: str | None, catalog_dir: Path, recipes_dir: Path
) -> tuple[Path, Path]:
    """An entry for a model to export (HF id or local HF dir), read from its config only.

    A folder that ships code (`auto_map`, a .py file) is refused before transformers sees
    it; its config files are read within bounds (`modelfolder`)."""
    from winml_recipes.exporters import auto, heads, sam, towers
    from winml_recipes.modelfolder import check_config_file, check_folder
    from winml_recipes.sources import LocalHfDir

    if isinstance(model_ref, LocalHfDir):
        if not model_ref.path.is_dir():
            raise RecipeError(f"init: {printable(model_ref.path)} is not a folder")
        configs = check_folder(model_ref.path)
        config_dir, source = model_ref.path, {"ref": _relative_ref(model_ref.path, catalog_dir)}
        preprocessor = configs.get("preprocessor_config.json")
    else:
        from winml_recipes.hub import download_file

        path, commit = download_file(model_ref.repo_id, "config.json", model_ref.revision)
        check_config_file(path)
        config_dir, source = path.parent, {"ref": model_ref.repo_id, "revision": commit}
        configs = {}
        preprocessor = _hub_preprocessor(model_ref)
    config_path = config_dir / "config.json"
    config = _auto_config(config_dir)
    preprocessor_path = config_dir / "preprocessor_config.json"
    try:
        if config.model_type in sam.BY_MODEL_TYPE:  # SAM, SAM 2.1, SAM 3 tracker
            family, task = sam.BY_MODEL_TYPE[config.model_type].family, "mask-generation"
            components = sam.catalog_components(config, preprocessor)
        elif heads.is_two_tower(config):  # CLIP / SigLIP: text tower + vision tower
            family, task = "two_tower", towers.TASK
            components = towers.catalog_components(
                config, preprocessor, config_path=config_path, source=preprocessor_path
            )
        else:
            family, task = "auto", auto.task_of(config)
            components = auto.catalog_components(
                config,
                task,
                preprocessor,
                config_path=config_path,
                source=preprocessor_path,
                vocab=_ctc_vocab(model_ref, configs),
            )
    except (TypeError, ValueError, KeyError, IndexError, AttributeError) as exc:
        raise RecipeError(
            f"init: {printable(config_path)}: its fields do not describe a model's inputs and "
            f"outputs ({type(exc).__name__}: {printable(exc)[:160]}); fix or regenerate it"
        ) from None
    default = entry_name(Path(ref.rstrip("/")).name)
    entry = {
        "schema_version": 1,
        "name": name or default,
        "task": auto.vision.entry_task(config, task) if family == "auto" else task,
        "license": "unknown",
        "description": f"Generated by winml-recipes init from {ref} ({config.model_type})",
        "family": family,
        "components": {c: {"source": source, **spec} for c, spec in components.items()},
    }
    dims = {k: v for spec in components.values() for k, v in spec["dims"].items()}
    steps = SAM_STEPS if family in sam.ARCHITECTURES else None
    return _write_init(entry, dims, ref, catalog_dir, recipes_dir, config_path, steps)


def _ctc_vocab(model_ref: Any, configs: dict[str, Any]) -> dict[str, Any] | None:
    """A local folder's tokenizer pad token and vocab.json (a CTC head's blank is checked
    against them), None when it has none."""
    from winml_recipes.untrusted import read_json_bounded

    folder = getattr(model_ref, "path", None)
    if folder is None or not (Path(folder) / "vocab.json").is_file():
        return None
    vocab = read_json_bounded(Path(folder) / "vocab.json")
    pad = (configs.get("tokenizer_config.json") or {}).get("pad_token", "<pad>")
    return {"pad_token": pad, "vocab": vocab if isinstance(vocab, dict) else {}}


def _auto_config(config_dir: Path) -> Any:
    """transformers' config for a folder already checked by `modelfolder` (no code run)."""
    from transformers import AutoConfig

    from winml_recipes.console import quiet_stdout
    from winml_recipes.modelfolder import TRUST_REMOTE_CODE

    try:
        with quiet_stdout():
            return AutoConfig.from_pretrained(str(config_dir), trust_remote_code=TRUST_REMOTE_CODE)
    except Exception as exc:
        text = " ".join(str(exc).split()).split(" Errors: ")[0] or type(exc).__name__
        raise RecipeError(
            f"init: {printable(config_dir / 'config.json')}: transformers cannot read it "
            f"({printable(text)[:300]}); use a config of a model transformers ships"
        ) from None


def _hub_preprocessor(model_ref) -> dict | None:
    """A Hub model's `preprocessor_config.json` (image size, mean, std), if it has one."""
    from winml_recipes.hub import download_file
    from winml_recipes.modelfolder import check_config_file
    from winml_recipes.sdk.errors import SourceError

    try:
        path, _ = download_file(model_ref.repo_id, "preprocessor_config.json", model_ref.revision)
    except SourceError:
        return None  # not every model has one
    return check_config_file(path)


def _relative_ref(path: Path, catalog_dir: Path) -> str:
    relative = os.path.relpath(path, catalog_dir.resolve())
    return relative if relative.startswith("..") else f"./{relative}"
