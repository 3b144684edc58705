"""Catalog sources -> `Source` objects (local file digests, export specs), and source facts."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from winml_recipes.catalog import CatalogEntry, Component
from winml_recipes.exporters import ENTRY_POINT_GROUP as EXPORTERS
from winml_recipes.exporters import families
from winml_recipes.modelfolder import check_config_file, check_folder, refuse_auto_map
from winml_recipes.sdk.errors import SourceError
from winml_recipes.sdk.plugins import check_available
from winml_recipes.sdk.types import ModelFacts, Source
from winml_recipes.sources import CatalogName, HfModelId, HubOnnx, LocalHfDir, LocalOnnx, classify
from winml_recipes.untrusted import UntrustedInputError


def canonical_json(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def resolve_source(
    entry: CatalogEntry, component: Component, *, fetch: bool = True, name: str | None = None
) -> Source:
    """Turn a component's catalog source (its named source `name`, if it offers several)
    into a `Source`; local files must exist.

    With fetch=False (validation) Hub files are classified but not downloaded.
    """
    spec, picked = component.pick_source(name)
    where = f"{entry.path}: components.{component.name}." + (
        f"sources.{picked}" if picked else "source"
    )
    if "config" in spec:
        _checked(lambda: refuse_auto_map(spec["config"], "config"), where)
        family = _family(entry, where)
        export = {
            "family": family,
            "component": _export_component(family, component.name),
            "task": component.task,
            "config": spec["config"],
            "seed": int(spec.get("seed", 0)),
        }
        ref = f"random weights ({spec['config']['model_type']}, seed {export['seed']})"
        return Source("export", ref, export=export, digest=_spec_digest(export))
    ref = classify(spec["ref"], revision=spec.get("revision"), base=entry.path.parent)
    if isinstance(ref, LocalOnnx):
        if not ref.path.is_file():
            raise SourceError(f"source file not found: {ref.path}", where=where)
        from winml_recipes.onnx.io import artifact_sha256

        return Source("onnx", str(ref.path), path=ref.path, digest=artifact_sha256(ref.path))
    if isinstance(ref, LocalHfDir | HfModelId):
        family = _family(entry, where)
        model_id = str(ref.path) if isinstance(ref, LocalHfDir) else ref.repo_id
        if isinstance(ref, LocalHfDir) and not ref.path.is_dir():
            raise SourceError(f"source directory not found: {ref.path}", where=where)
        if isinstance(ref, LocalHfDir):
            _checked(lambda: check_folder(ref.path), where)  # before _dir_digest walks it
        revision = None
        if isinstance(ref, HfModelId):
            revision = _hub_commit(ref, where) if fetch else ref.revision
        export = {
            "family": family,
            "component": _export_component(family, component.name),
            "task": component.task,
            "model_id": model_id,
            "revision": revision,
        }
        digest_input = dict(export)
        if isinstance(ref, LocalHfDir):
            digest_input["files"] = _dir_digest(ref.path)
        return Source(
            "export",
            spec["ref"],
            revision=revision,
            export=export,
            digest=_spec_digest(digest_input),
        )
    if isinstance(ref, HubOnnx) and not fetch:
        return Source("hub_onnx", str(ref), revision=ref.revision, digest=_spec_digest(str(ref)))
    if isinstance(ref, HubOnnx):
        import sys

        from winml_recipes.hub import download_onnx
        from winml_recipes.onnx.io import artifact_sha256

        try:
            fetched = download_onnx(ref, progress=sys.stderr.isatty())
        except SourceError as exc:
            raise SourceError(exc.message, where=exc.where or where) from None
        # The resolved commit is part of the digest, and so of every cache key downstream.
        digest = _spec_digest([fetched.commit, artifact_sha256(fetched.path)])
        return Source(
            "hub_onnx", str(ref), path=fetched.path, revision=fetched.commit, digest=digest
        )
    assert isinstance(ref, CatalogName)
    raise SourceError(
        f"'{spec['ref']}' is not a model reference (a catalog name cannot be a source); "
        "use a local path, org/repo/file.onnx or an HF model id",
        where=where,
    )


def _hub_commit(ref: HfModelId, where: str) -> str:
    """The commit a model id's revision points to (config.json is fetched to learn it), so
    the export reads pinned weights and the cache key changes when the repo does."""
    from winml_recipes.hub import download_file

    try:
        path, commit = download_file(ref.repo_id, "config.json", ref.revision)
    except SourceError as exc:
        raise SourceError(exc.message, where=exc.where or where) from None
    _checked(lambda: check_config_file(path), where)
    return commit


def _checked(check: Callable[[], object], where: str) -> None:
    """Run a `modelfolder` check; its one-line error also names the catalog source."""
    try:
        check()
    except UntrustedInputError as exc:
        raise UntrustedInputError(exc.message, where=where) from None


def _family(entry: CatalogEntry, where: str) -> str:
    if not entry.family:
        raise SourceError(
            f"exporting needs 'family' in the catalog entry ({', '.join(families())})",
            where=where,
        )
    if entry.family not in families():
        check_available(EXPORTERS, entry.family, "exporter family")
    return entry.family


def _export_component(family: str, component: str) -> str:
    """The exporter component a catalog component of this family exports as."""
    return families()[family].component_for(component)


def _spec_digest(value: object) -> str:
    return hashlib.sha256(canonical_json(value).encode()).hexdigest()


def _dir_digest(path: Path) -> dict[str, int]:
    """Cheap identity of a local HF directory: file names, sizes and mtimes."""
    out = {}
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            out[str(p.relative_to(path))] = f"{st.st_size}:{st.st_mtime_ns}"
    return out


def source_facts(source: Source) -> ModelFacts:
    """Facts about a source, computed once before planning; never runs onnxruntime."""
    if source.kind == "hub_onnx" and source.path is None:
        # Not fetched (validation only): an ONNX file whose other facts are unknown.
        return ModelFacts(is_onnx=True, has_reference=True)
    if source.path is None:
        return ModelFacts(is_onnx=False)
    return model_facts(source.path)


def model_facts(path: Path) -> ModelFacts:
    from winml_recipes.onnx.digest import graph_inputs
    from winml_recipes.onnx.io import load_model, sidecar_paths
    from winml_recipes.onnx.quant import detect_quantization
    from winml_recipes.onnx.stamp import is_normalized

    # Graph only: the stamp check streams external weights from disk instead of loading them.
    model = load_model(path, load_external_data=False)
    quant = detect_quantization(model)
    normalized = is_normalized(model, base_dir=path.parent)
    from winml_recipes.onnx.inputs import dim_names

    inputs = {vi.name for vi in graph_inputs(model.graph)}
    # named, unnamed and converter-style (-1, 0) dynamic dims of the inputs
    dynamic = sorted({n for (t, _), n in dim_names(model).items() if t in inputs})
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    sidecars = sidecar_paths(path)
    return ModelFacts(
        is_onnx=True,
        quantized=quant.quantized,
        quant_summary=quant.describe() if quant.quantized else "",
        activation_dtypes=tuple(quant.activation_dtypes),
        weight_dtypes=tuple(quant.weight_dtypes),
        normalized=normalized,
        normalized_why="stamp matches the graph fingerprint" if normalized else "",
        opset=opset,
        external_data=bool(sidecars),
        size_bytes=path.stat().st_size + sum(p.stat().st_size for p in sidecars),
        dynamic_dims=tuple(dynamic),
        inputs=tuple(vi.name for vi in graph_inputs(model.graph)),
        outputs=tuple(o.name for o in model.graph.output),
        has_reference=not quant.quantized,
    )
