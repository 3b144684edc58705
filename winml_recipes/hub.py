"""ONNX files hosted on the Hugging Face Hub: download (with sidecars) and discovery.

Files land in the ordinary Hugging Face cache through `huggingface_hub.hf_hub_download`, so
a file fetched once is shared with every other HF tool and works offline afterwards.

Settings are read from the environment on every call and passed to huggingface_hub
explicitly: HF_ENDPOINT, HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE), HF_HUB_CACHE / HF_HOME
for the cache; HF_TOKEN is read by huggingface_hub itself. (huggingface_hub reads
HF_ENDPOINT, HF_HUB_OFFLINE and HF_HOME once, when it is imported; reading them here at call
time keeps a process that imported it early, e.g. through transformers, in step.)

External data ("sidecars") sits beside the model in the same snapshot folder:
- every file the model's tensors reference (`location`) is required: a missing one is an
  error now, not an unreadable model later;
- `<file>_data` and `<file>.data` are also tried, best-effort: "not in the repo" is silent,
  any other failure is a warning naming the file.
Sidecars come from the model's resolved commit, never from a branch that may have moved.
Sidecars are kept as real files in the snapshot folder, not symlinks to `blobs/`: onnx
refuses external data behind a symlink or a hard link.

Without a network the code fails fast: an uncached file is probed with one request first,
so "connection refused" is reported at once instead of after huggingface_hub's ~23 s of
retries; HTTP errors (e.g. a 500) still get huggingface_hub's retries.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import shutil
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from winml_recipes.sdk.errors import SourceError, WinmlError
from winml_recipes.sources import (
    CatalogName,
    HfModelId,
    HubOnnx,
    LocalHfDir,
    LocalOnnx,
    classify,
    is_onnx_name,
)
from winml_recipes.untrusted import UntrustedInputError, printable

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "https://huggingface.co"
SIDECAR_SUFFIXES = ("_data", ".data")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TRUE = {"1", "ON", "YES", "TRUE"}


class SidecarWarning(UserWarning):
    """An optional sidecar could not be fetched (the model may still load without it)."""


@dataclass(frozen=True)
class HubFile:
    """A Hub ONNX file in the local cache: `path` is inside `snapshots/<commit>/`."""

    path: Path
    commit: str
    sidecars: list[Path]
    repo_id: str
    filename: str
    revision: str | None

    @property
    def pinned(self) -> HubOnnx:
        """The same file pinned to its commit."""
        return HubOnnx(self.repo_id, self.filename, self.commit)


@dataclass(frozen=True)
class HubEntry:
    """One `.onnx` file of a Hub repo with its size and its sidecars' sizes."""

    repo_id: str
    path: str
    size: int
    sidecars: dict[str, int] = field(default_factory=dict)
    revision: str | None = None
    commit: str | None = None

    @property
    def total_size(self) -> int:
        return self.size + sum(self.sidecars.values())

    @property
    def ref(self) -> HubOnnx:
        return HubOnnx(self.repo_id, self.path, self.revision)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class _Settings:
    endpoint: str
    cache_dir: Path
    offline: bool


def _is_true(value: str | None) -> bool:
    return value is not None and value.strip().upper() in _TRUE


def _settings() -> _Settings:
    from huggingface_hub import constants

    env = os.environ
    endpoint = (env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")
    cache = env.get("HF_HUB_CACHE") or env.get("HUGGINGFACE_HUB_CACHE")
    if not cache:
        home = env.get("HF_HOME") or os.path.join(
            env.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        cache = os.path.join(home, "hub")
    offline = (
        _is_true(env.get("HF_HUB_OFFLINE") or env.get("TRANSFORMERS_OFFLINE"))
        or constants.is_offline_mode()
    )
    cache_dir = Path(os.path.expandvars(cache)).expanduser().resolve()
    return _Settings(endpoint, cache_dir, offline)


def _library() -> dict[str, str]:
    from winml_recipes import __version__

    return {"library_name": "winml-recipes", "library_version": __version__}


def _one_line(text: object, limit: int = 200) -> str:
    """`text` on one printable line (it may quote a server: control characters escaped)."""
    flat = printable(" ".join(str(text).split()))
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


# --------------------------------------------------------------------------- download


class _Missing(Exception):
    """The file does not exist at that revision (the Hub said so, now or in the cache)."""


@dataclass
class _Fetch:
    repo_id: str
    settings: _Settings
    progress: bool
    reachable: bool = False  # a request to the endpoint succeeded during this download

    def label(self, filename: str, revision: str) -> str:
        return f"{self.repo_id}@{revision}/{filename}"

    def get(self, filename: str, revision: str) -> tuple[Path, bool]:
        """The cached path of `filename` at `revision`, downloading it when needed, and
        whether its blob was downloaded by this call.

        Raises `_Missing` when the file does not exist, `SourceError` (or
        `UntrustedInputError` for a hostile answer) for everything else. Every request runs
        under `hubguard`'s checks and limits for this one file.
        """
        from winml_recipes import hubguard

        with hubguard.budget(self.label(filename, revision), "download"):
            return self._get(filename, revision)

    def _get(self, filename: str, revision: str) -> tuple[Path, bool]:
        from huggingface_hub import _CACHED_NO_EXIST, hf_hub_download, try_to_load_from_cache

        s = self.settings
        cached = try_to_load_from_cache(
            self.repo_id, filename, cache_dir=s.cache_dir, revision=revision
        )
        if s.offline:
            if isinstance(cached, str):
                return Path(cached), False
            if cached is _CACHED_NO_EXIST:
                raise _Missing
            raise SourceError(
                f"{self.label(filename, revision)} is not in the Hugging Face cache "
                f"({s.cache_dir}) and HF_HUB_OFFLINE is set; run once online, or "
                f"`hf download {self.repo_id} --revision {revision} "
                f"--include '{filename}*'`"
            )
        if cached is _CACHED_NO_EXIST and _COMMIT.match(revision):
            raise _Missing  # a commit never changes: no need to ask again
        if not isinstance(cached, str) and not self.reachable:
            self._probe(filename, revision)
        blobs = self.blobs_dir()
        before = set(os.listdir(blobs)) if blobs.is_dir() else set()
        try:
            path = hf_hub_download(
                self.repo_id,
                filename,
                revision=revision,
                cache_dir=s.cache_dir,
                endpoint=s.endpoint,
                tqdm_class=None if self.progress else _silent_tqdm(),
                **_library(),
            )
        except Exception as exc:
            raise self._explain(exc, filename, revision) from None
        target = Path(path).resolve()
        fresh = target.parent == blobs.resolve() and target.name not in before
        return Path(path), fresh

    def blobs_dir(self) -> Path:
        from huggingface_hub.file_download import repo_folder_name

        folder = repo_folder_name(repo_id=self.repo_id, repo_type="model")
        return self.settings.cache_dir / folder / "blobs"

    def _probe(self, filename: str, revision: str) -> None:
        """One request without retries, so an unreachable endpoint fails now, not in 23 s."""
        import httpx2
        from huggingface_hub import get_hf_file_metadata, hf_hub_url
        from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

        url = hf_hub_url(self.repo_id, filename, revision=revision, endpoint=self.settings.endpoint)
        try:
            get_hf_file_metadata(
                url, endpoint=self.settings.endpoint, retry_on_errors=False, **_library()
            )
        except HfHubHTTPError:
            pass  # the endpoint answered; the download call says what the answer means
        except (httpx2.TransportError, httpx2.InvalidURL, OfflineModeIsEnabled) as exc:
            raise SourceError(
                f"cannot reach the Hugging Face Hub at {self.settings.endpoint} to fetch "
                f"{self.label(filename, revision)} ({_reason(exc)}); check HF_ENDPOINT and the "
                "network, or set HF_HUB_OFFLINE=1 to use the cache"
            ) from None
        self.reachable = True

    def _explain(self, exc: Exception, filename: str, revision: str) -> Exception:
        """Map a huggingface_hub failure to `_Missing` or a one-line `SourceError`."""
        import httpx2
        from huggingface_hub.errors import (
            GatedRepoError,
            HfHubHTTPError,
            HFValidationError,
            LocalEntryNotFoundError,
            RemoteEntryNotFoundError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        what = self.label(filename, revision)
        endpoint = self.settings.endpoint
        if isinstance(exc, WinmlError):
            return exc  # hubguard's one-line refusal (a hostile or broken server)
        if isinstance(exc, RemoteEntryNotFoundError):
            return _Missing()
        if isinstance(exc, GatedRepoError):
            return SourceError(
                f"{self.repo_id} is gated: accept its conditions on the Hub and set HF_TOKEN "
                f"(fetching {what})"
            )
        if isinstance(exc, RepositoryNotFoundError):
            return SourceError(_repo_not_found(self.repo_id, endpoint))
        if isinstance(exc, RevisionNotFoundError):
            return SourceError(_revision_not_found(self.repo_id, revision))
        if isinstance(exc, LocalEntryNotFoundError):
            # Online, this means the metadata request failed and the cache has no copy.
            cause = exc.__cause__ or exc
            return SourceError(
                f"could not fetch {what} from {endpoint} ({_reason(cause)}) and it is not in "
                "the Hugging Face cache; try again later, or check HF_ENDPOINT"
            )
        if isinstance(exc, HfHubHTTPError):
            return SourceError(f"could not fetch {what} from {endpoint} ({_reason(exc)})")
        if isinstance(exc, httpx2.HTTPError | httpx2.InvalidURL):
            return SourceError(
                f"download of {what} failed ({_reason(exc)}); nothing was cached, run again "
                "to retry"
            )
        if isinstance(exc, HFValidationError):
            return SourceError(f"invalid Hub reference {what}: {_one_line(exc)}")
        if isinstance(exc, OSError) and "Consistency check failed" in str(exc):
            got = re.search(r"should be of size (\d+) but has size (\d+)", str(exc))
            detail = f"got {got[2]} of {got[1]} bytes" if got else _one_line(exc, 120)
            return SourceError(
                f"download of {what} was cut short ({detail}); nothing was cached, run again "
                "to retry"
            )
        if isinstance(exc, OSError):
            return SourceError(
                f"could not store {what} in the Hugging Face cache {self.settings.cache_dir} "
                f"({_reason(exc)})"
            )
        return exc  # a bug, not a source problem: let it surface


def _reason(exc: BaseException) -> str:
    """A short, one-line cause: "HTTP 500 Internal Server Error", "connection refused", ..."""
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if isinstance(status, int):
        phrase = getattr(response, "reason_phrase", "") or ""
        return f"HTTP {status} {phrase}".strip()
    text = str(exc)
    if "refused" in text.lower():
        return "connection refused"
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__, 160)


def _repo_not_found(repo_id: str, endpoint: str) -> str:
    return (
        f"Hub repo not found: {repo_id} (at {endpoint}); check the name, or set HF_TOKEN "
        "if the repo is private"
    )


def _revision_not_found(repo_id: str, revision: str) -> str:
    return (
        f"revision '{revision}' not found in {repo_id}; use a branch, tag or commit sha that exists"
    )


def _silent_tqdm() -> type:
    from huggingface_hub.utils import tqdm as hf_tqdm

    class _Silent(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return _Silent


def _commit_of(path: Path, filename: str) -> str:
    """`.../snapshots/<commit>/<filename>` -> commit."""
    snapshot = path.parents[filename.count("/")]
    if snapshot.parent.name != "snapshots" or not _COMMIT.match(snapshot.name):
        raise SourceError(f"unexpected Hugging Face cache layout: {path}")
    return snapshot.name


def external_locations(model_path: Path, filename: str) -> list[str]:
    """Repo paths of the external-data files the model references (relative to its folder).

    An unreadable model gives [] (later stages report it); a location outside the repo is
    an error.
    """
    import onnx

    from winml_recipes.hubguard import repo_path_problem

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:
        return []
    folder = posixpath.dirname(filename)
    found: set[str] = set()
    for tensor in _tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        loc = location.replace("\\", "/")
        repo_path = posixpath.normpath(posixpath.join(folder, loc))
        if (
            not loc
            or loc.startswith("/")
            or repo_path.startswith("../")
            or repo_path == ".."
            or repo_path_problem(repo_path) is not None
        ):
            raise SourceError(
                f"{filename} references external data '{printable(location)}' outside its "
                "repo or with an unsafe name; refusing to fetch it"
            )
        found.add(repo_path)
    return sorted(found)


def _tensors(model: Any):
    def graph_tensors(graph: Any):
        yield from graph.initializer
        for sparse in graph.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in graph.node:
            yield from node_tensors(node)

    def node_tensors(node: Any):
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            if attr.HasField("g"):
                yield from graph_tensors(attr.g)
            for g in attr.graphs:
                yield from graph_tensors(g)

    yield from graph_tensors(model.graph)
    for function in model.functions:
        for node in function.node:
            yield from node_tensors(node)


def _as_real_file(path: Path, fresh: bool) -> Path:
    """Make a sidecar in the snapshot folder a real file with one link.

    onnx refuses external data behind a symlink or with several hard links, and the cache
    keeps snapshot files as symlinks to `blobs/`. A blob this call just downloaded is moved
    into the snapshot (what huggingface_hub itself does where symlinks are unsupported); an
    older blob may be shared with other snapshots, so it is copied.
    """
    if not path.is_symlink():
        return path
    target = path.resolve()
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        if fresh:
            os.replace(target, tmp)
        else:
            shutil.copyfile(target, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        if path.is_file() and not path.is_symlink():
            return path  # another process did it meanwhile
        raise SourceError(
            f"could not place sidecar {path.name} beside its model in {path.parent} ({exc})"
        ) from None
    finally:
        tmp.unlink(missing_ok=True)
    return path


def download_onnx(ref: HubOnnx, *, progress: bool = False) -> HubFile:
    """Fetch a Hub ONNX file and its sidecars into the HF cache; raise a one-line SourceError.

    `progress` shows huggingface_hub's download bars (they stay off otherwise).
    """
    revision = ref.revision or "main"
    fetch = _Fetch(ref.repo_id, _settings(), progress)
    try:
        path, _ = fetch.get(ref.filename, revision)
    except _Missing:
        raise SourceError(f"file not found in {ref.repo_id}@{revision}: {ref.filename}") from None
    commit = _commit_of(path, ref.filename)
    required = external_locations(path, ref.filename)
    optional = [
        f"{ref.filename}{suffix}"
        for suffix in SIDECAR_SUFFIXES
        if f"{ref.filename}{suffix}" not in required
    ]
    sidecars: list[Path] = []
    for name in required:
        try:
            sidecars.append(_as_real_file(*fetch.get(name, commit)))
        except _Missing:
            raise SourceError(
                f"{ref.filename} references external data {name} which is not in "
                f"{ref.repo_id}@{commit[:12]}; the model cannot be loaded"
            ) from None
    for name in optional:
        if fetch.settings.offline:
            # Not referenced by the model, so not needed: never a reason to fail offline.
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(
                ref.repo_id, name, cache_dir=fetch.settings.cache_dir, revision=commit
            )
            if isinstance(cached, str):
                sidecars.append(_as_real_file(Path(cached), False))
            continue
        try:
            sidecars.append(_as_real_file(*fetch.get(name, commit)))
        except _Missing:
            pass  # expected: most models have no sidecar
        except SourceError as exc:
            warnings.warn(
                f"could not fetch optional sidecar {ref.repo_id}@{commit[:12]}/{name}: "
                f"{exc.message}",
                SidecarWarning,
                stacklevel=2,
            )
    return HubFile(path, commit, sidecars, ref.repo_id, ref.filename, ref.revision)


def download_file(repo_id: str, filename: str, revision: str | None = None) -> tuple[Path, str]:
    """Fetch one small file (e.g. config.json) of a Hub repo; returns (path, commit sha)."""
    revision = revision or "main"
    fetch = _Fetch(repo_id, _settings(), False)
    try:
        path, _ = fetch.get(filename, revision)
    except _Missing:
        raise SourceError(f"file not found in {repo_id}@{revision}: {filename}") from None
    return path, _commit_of(path, filename)


# --------------------------------------------------------------------------- discovery


def list_onnx(repo_id: str, revision: str | None = None) -> list[HubEntry]:
    """Every `.onnx` file of a Hub repo (case-insensitive), with sizes and sidecars.

    Sidecars are files in the same folder named `<file>_data*` or `<file>.data*`. The
    listing runs under `hubguard`'s checks: bounded pages, entries, bytes and time, and
    every entry's path and size checked before huggingface_hub parses it.
    """
    from winml_recipes import hubguard

    s = _settings()
    rev = revision or "main"
    if s.offline:
        raise SourceError(
            f"listing the files of {repo_id} needs the Hub, but HF_HUB_OFFLINE is set; "
            "unset it, or name the file (org/repo/path.onnx) to use the cache"
        )
    with hubguard.budget(f"{repo_id}@{rev}", "listing"):
        commit, sizes = _list_files(repo_id, rev, s)
    entries = []
    for path in sorted(p for p in sizes if is_onnx_name(p)):
        stem = posixpath.basename(path)
        folder = posixpath.dirname(path)
        sidecars = {
            p: sizes[p]
            for p in sorted(sizes)
            if p != path
            and not is_onnx_name(p)
            and posixpath.dirname(p) == folder
            and posixpath.basename(p).startswith(tuple(stem + x for x in SIDECAR_SUFFIXES))
        }
        entries.append(HubEntry(repo_id, path, sizes[path], sidecars, revision, commit))
    return entries


def _list_files(repo_id: str, rev: str, s: _Settings) -> tuple[str | None, dict[str, int]]:
    """(commit, {path: size}) of every file of `repo_id` at `rev`; one-line errors."""
    import httpx2
    from huggingface_hub import HfApi
    from huggingface_hub.errors import (
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )
    from huggingface_hub.hf_api import RepoFile

    from winml_recipes.hubguard import is_commit, repo_path_problem

    api = HfApi(endpoint=s.endpoint, **_library())
    commit: str | None = None
    try:
        # One request without retries: an unreachable endpoint fails now, and the listing
        # below is pinned to the commit so that it is consistent.
        commit = api.model_info(repo_id, revision=rev, expand=["sha"]).sha
    except WinmlError:
        raise
    except RepositoryNotFoundError:
        raise SourceError(_repo_not_found(repo_id, s.endpoint)) from None
    except RevisionNotFoundError:
        raise SourceError(_revision_not_found(repo_id, rev)) from None
    except HfHubHTTPError:
        pass  # e.g. a 500: the listing retries
    except (httpx2.TransportError, httpx2.InvalidURL, OfflineModeIsEnabled) as exc:
        raise SourceError(
            f"cannot reach the Hugging Face Hub at {s.endpoint} to list {repo_id}@{rev} "
            f"({_reason(exc)}); check HF_ENDPOINT and the network"
        ) from None
    except Exception as exc:
        raise SourceError(f"could not list {repo_id}@{rev}: {_reason(exc)}") from None
    if commit is not None and not is_commit(commit):
        raise UntrustedInputError(
            f"{repo_id}@{rev}: the Hub server's model info has sha "
            f"'{printable(commit)[:60]}', not a 40-hex commit sha; refusing it"
        )
    sizes: dict[str, int] = {}
    try:
        for e in api.list_repo_tree(repo_id, revision=commit or rev, recursive=True):
            if not isinstance(e, RepoFile):
                continue
            # hubguard checked each page already; this guards the fields used here.
            problem = repo_path_problem(e.path)
            if problem is not None or not isinstance(e.size, int) or e.path in sizes:
                why = "is listed twice" if e.path in sizes else (problem or "has no byte size")
                raise UntrustedInputError(
                    f"{repo_id}@{rev}: file listing entry '{printable(e.path)[:80]}' {why}; "
                    "refusing the listing"
                )
            sizes[e.path] = e.size
    except WinmlError:
        raise
    except RepositoryNotFoundError:
        raise SourceError(_repo_not_found(repo_id, s.endpoint)) from None
    except RevisionNotFoundError:
        raise SourceError(_revision_not_found(repo_id, rev)) from None
    except (HfHubHTTPError, httpx2.HTTPError, httpx2.InvalidURL) as exc:
        raise SourceError(
            f"could not list {repo_id}@{rev} from {s.endpoint} ({_reason(exc)})"
        ) from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UntrustedInputError(
            f"{repo_id}@{rev}: the Hub server's file listing is malformed ({_reason(exc)})"
        ) from None
    return commit, sizes


def local_model_file(ref: str, *, base: Path | None = None) -> Path:
    """The local .onnx file for a command-line model argument: a path, or a Hub ONNX ref
    (downloaded, with its sidecars). Anything else is a one-line SourceError.

    Here rather than in `sources` (which classifies references): it downloads, and
    `sources` stays free of the Hub client (no import cycle).
    """
    model_ref = classify(ref, base=base)
    if isinstance(model_ref, CatalogName) and is_onnx_name(ref):
        raise SourceError("file not found; check the path", where=ref)
    if isinstance(model_ref, LocalOnnx):
        if not model_ref.path.exists():
            raise SourceError("file not found; check the path", where=str(model_ref.path))
        return model_ref.path
    if isinstance(model_ref, HubOnnx):
        import sys

        return download_onnx(model_ref, progress=sys.stderr.isatty()).path
    if isinstance(model_ref, LocalHfDir):
        what = (
            "is a directory, expected an .onnx file"
            if model_ref.path.is_dir()
            else ("file not found; check the path")
        )
        raise SourceError(what, where=str(model_ref.path))
    kind = "a Hugging Face model id" if isinstance(model_ref, HfModelId) else "a catalog name"
    raise SourceError(
        f"'{ref}' looks like {kind}, not an ONNX file; give a local .onnx path (./model.onnx) "
        "or a Hub ONNX file (org/repo/path.onnx)"
    )
