"""One classifier for every model reference, without network I/O.

A reference is one of:
- a local path: it exists, or it starts with ./ ../ ~/ / or a Windows drive letter;
- a Hub-hosted ONNX file: `org/repo/path/to/file.onnx` (suffix case-insensitive), with an
  optional revision `org/repo@rev/path.onnx`;
- an HF model id `org/model` (exported with torch);
- a catalog name (no slash).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from winml_recipes.sdk.errors import SourceError

_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")
_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class LocalOnnx:
    path: Path


@dataclass(frozen=True)
class LocalHfDir:
    path: Path


@dataclass(frozen=True)
class HubOnnx:
    repo_id: str
    filename: str
    revision: str | None

    def __str__(self) -> str:
        rev = f"@{self.revision}" if self.revision else ""
        return f"{self.repo_id}{rev}/{self.filename}"


@dataclass(frozen=True)
class HfModelId:
    repo_id: str
    revision: str | None


@dataclass(frozen=True)
class CatalogName:
    name: str


ModelRef = LocalOnnx | LocalHfDir | HubOnnx | HfModelId | CatalogName


def is_onnx_name(name: str) -> bool:
    return name.lower().endswith(".onnx")


def _looks_local(ref: str, base: Path) -> bool:
    return (
        ref.startswith(("./", "../", "~/", "/", ".\\", "..\\", "~\\"))
        or bool(_DRIVE.match(ref))
        or ref in (".", "..")
        or (base / ref).expanduser().exists()
    )


def classify(ref: str, *, revision: str | None = None, base: Path | None = None) -> ModelRef:
    """Classify `ref`; relative local paths resolve against `base` (default: cwd)."""
    base = base or Path.cwd()
    if not ref or not ref.strip():
        raise SourceError("empty model reference")
    if _looks_local(ref, base):
        path = (base / Path(ref).expanduser()).resolve()
        if is_onnx_name(path.name) or path.is_file():
            return LocalOnnx(path)
        return LocalHfDir(path)
    if "/" not in ref and "\\" not in ref:
        return CatalogName(ref)
    head, _, rest = ref.partition("/")
    repo_name, _, rest = rest.partition("/")
    at_rev = None
    if "@" in repo_name:
        repo_name, _, at_rev = repo_name.partition("@")
        if not at_rev:
            raise SourceError(f"empty revision after '@' in '{ref}'")
    if at_rev and revision and at_rev != revision:
        raise SourceError(f"'{ref}' names revision '{at_rev}' but revision is '{revision}'")
    rev = at_rev or revision
    for seg in (head, repo_name):
        if not _SEGMENT.match(seg):
            raise SourceError(f"invalid Hub repo id in '{ref}'; expected org/repo[/path.onnx]")
    repo_id = f"{head}/{repo_name}"
    if not rest:
        if is_onnx_name(repo_name):
            # `models/encoder.onnx` is a missing local file, not an HF model id.
            raise SourceError(
                f"'{ref}' is not a file (relative to {base}) and not a Hub ONNX file "
                "(org/repo/path.onnx); for a local path start it with ./"
            )
        return HfModelId(repo_id, rev)
    parts = rest.replace("\\", "/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        raise SourceError(f"invalid path inside Hub ref '{ref}': empty, '.' or '..' segment")
    if not is_onnx_name(parts[-1]):
        raise SourceError(
            f"'{ref}' is neither a local path nor a Hub .onnx file; "
            "for a local path start it with ./ or use an absolute path"
        )
    return HubOnnx(repo_id, "/".join(parts), rev)
