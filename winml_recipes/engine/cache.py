"""Content-addressed step cache.

An entry is a directory named by its key, holding the step's output files and
`result.json`. Entries are written under a temp name and renamed into place, so a
reader sees a whole entry or none; an interrupted writer leaves only a temp dir that
the next `put` sweeps.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from functools import cache as memoize
from importlib import metadata
from pathlib import Path
from typing import Any

import winml_recipes
from winml_recipes.onnx.io import file_sha256

CACHE_ENV = "WINML_RECIPES_CACHE"
RESULT_FILE = "result.json"
LOCKS = "locks"  # one lock file per key being computed (never matches the `??/` entry dirs)
WORK = "work"  # scratch folders of steps run as tasks (beside the entries: a move, no copy)
VERSIONED_PACKAGES = ("onnx", "onnxruntime", "onnxscript", "onnx-ir", "torch", "transformers")
STALE_TMP_SECONDS = 3600


@memoize
def library_versions() -> dict[str, str | None]:
    """Versions that change emitted graphs; read from metadata (importing torch is slow)."""
    out: dict[str, str | None] = {"winml-recipes": winml_recipes.__version__}
    for name in VERSIONED_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def default_cache_dir() -> Path:
    """$WINML_RECIPES_CACHE, else the platform's cache folder: %LOCALAPPDATA% on Windows,
    $XDG_CACHE_HOME or ~/.cache elsewhere (what platformdirs would say, without the dependency)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    if os.name == "nt":
        base = os.environ.get("LOCALAPPDATA") or str(Path.home() / "AppData" / "Local")
        return Path(base) / "winml-recipes" / "Cache"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "winml-recipes"


def check_output_apart(output_root: Path, cache_root: Path) -> None:
    """Refuse an output folder inside the step cache, or the cache inside the output folder:
    builds would write into the cache's store (or replace folders holding it)."""
    from winml_recipes.sdk.errors import PlanError
    from winml_recipes.untrusted import printable

    out, root = Path(output_root).resolve(), Path(cache_root).resolve()
    if out == root or out.is_relative_to(root):
        raise PlanError(
            f"-o {printable(output_root)} is inside the step cache {printable(root)}; choose an "
            f"output folder outside it (or point {CACHE_ENV} elsewhere)"
        )
    if root.is_relative_to(out):
        raise PlanError(
            f"the step cache {printable(root)} is inside the output folder -o "
            f"{printable(output_root)}; choose an output folder that does not hold it (or point "
            f"{CACHE_ENV} elsewhere)"
        )


@dataclass(frozen=True)
class CacheEntry:
    path: Path
    result: dict[str, Any]

    @property
    def model(self) -> Path | None:
        p = self.path / "model.onnx"
        return p if p.exists() else None


def _intact(path: Path, result: dict[str, Any]) -> bool:
    """Every file of the entry is a regular file (not a link) with its stored size and sha256.

    Hashing costs about a second per GB, far less than any step that made the file; a size
    check alone let a same-size file with zeroed weights ship as "cached".
    """
    import stat

    digests = result.get("sha256")
    if not isinstance(digests, dict) or set(digests) != set(result.get("files", {})):
        return False
    try:
        if set(os.listdir(path)) != {*digests, RESULT_FILE}:
            return False  # a file the entry never recorded was put there
    except OSError:
        return False
    for name, size in result["files"].items():
        file = path / name
        try:
            info = os.lstat(file)
        except OSError:
            return False
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        if file_sha256(file) != digests[name]:
            return False
    return True


_KEY = re.compile(r"[0-9a-f]{64}")
_SHARD = re.compile(r"[0-9a-f]{2}")
# What the cache itself puts at its top level, besides the `??/` shards of entries.
_OWN_FOLDERS = (LOCKS, WORK, "upstream")


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def _real_dir(path: Path) -> bool:
    """A folder, not a link to one (whatever a link points to is not the cache's)."""
    return path.is_dir() and not path.is_symlink()


def _last_use(entry: Path) -> float:
    try:
        return (entry / RESULT_FILE).stat().st_mtime
    except OSError:
        return 0.0


class StepCache:
    """Entries by key. Processes sharing a root (a pool, Ray workers on a shared folder)
    never compute one key at once: `get_or_claim` takes the key's lock when the entry is
    missing, so the second process waits and then reads the first one's entry."""

    def __init__(self, root: Path | None = None, enabled: bool = True) -> None:
        self.root = root or default_cache_dir()
        self.enabled = enabled
        self._claims: dict[str, Any] = {}

    def _dir(self, key: str) -> Path:
        return self.root / key[:2] / key

    def get_or_claim(self, key: str) -> CacheEntry | None:
        """The entry, or None with this process holding the key's lock until `put` (or
        `release_claims`). A process that finds the key claimed waits for the holder (its
        lock goes with it if it dies), then reads the entry it stored."""
        entry = self.get(key)
        if entry is not None or not self.enabled or key in self._claims:
            return entry
        from filelock import FileLock

        path = self.root / LOCKS / f"{key}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        lock.acquire()
        entry = self.get(key)  # stored by the process we waited for
        if entry is not None:
            lock.release()
            return entry
        self._claims[key] = lock
        return None

    def scratch(self):
        """A scratch folder inside the store for steps run as separate tasks (a pool
        process, a Ray worker): their outputs then move into an entry by a rename, never a
        copy. The folder is held by a lock while in use; folders whose lock is free (their
        process died) are swept first. Removed on exit."""
        from winml_recipes.engine.lock import held_folder

        return held_folder(self.root / WORK, f"{os.getpid()}-", "*")

    def release_claims(self) -> None:
        """Release every key this process claimed and did not store (a failed step)."""
        while self._claims:
            _, lock = self._claims.popitem()
            lock.release()

    def _release(self, key: str) -> None:
        lock = self._claims.pop(key, None)
        if lock is not None:
            lock.release()

    def get(self, key: str) -> CacheEntry | None:
        if not self.enabled:
            return None
        path = self._dir(key)
        try:
            result = json.loads((path / RESULT_FILE).read_text())
        except (OSError, ValueError):
            return None
        if not _intact(path, result):
            return None  # missing, changed, or a link: not trusted; the step runs again
        with contextlib.suppress(OSError):
            os.utime(path / RESULT_FILE)  # last use, for `cache prune`
        return CacheEntry(path, result)

    # ------------------------------------------------------------------ maintenance

    def _entries(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(
            p
            for p in self.root.glob("??/*")
            if _KEY.fullmatch(p.name) and _real_dir(p) and _real_dir(p.parent)
        )

    def foreign(self) -> list[Path]:
        """Items in the cache folder the cache did not make (its top level and the `??/`
        shards; links count as foreign): an output folder or files someone put there."""
        if not self.root.is_dir():
            return []
        out = []
        for item in sorted(self.root.iterdir()):
            shard = _SHARD.fullmatch(item.name) is not None
            if not _real_dir(item) or not (shard or item.name in _OWN_FOLDERS):
                out.append(item)
            elif shard:
                out += [
                    p
                    for p in sorted(item.iterdir())
                    if not _real_dir(p)
                    or not (_KEY.fullmatch(p.name) or p.name.startswith(".tmp-"))
                ]
        return out

    def _stored_outputs(self) -> list[Path]:
        return sorted((self.root / "upstream").glob("??/*.npz"))

    def stats(self) -> dict[str, Any]:
        """Entries and bytes: step results, and stored upstream outputs."""
        entries = self._entries()
        outputs = self._stored_outputs()
        return {
            "root": str(self.root),
            "entries": len(entries),
            "entry_bytes": sum(_tree_bytes(p) for p in entries),
            "stored_outputs": len(outputs),
            "stored_output_bytes": sum(p.stat().st_size for p in outputs),
        }

    def prune(self, max_bytes: int) -> dict[str, int]:
        """Delete the least recently used items until the cache holds at most `max_bytes`.

        Run it while no build is using the cache: an entry a running build reads from may
        be among the oldest.
        """
        items = [(_last_use(p), _tree_bytes(p), p) for p in self._entries()]
        items += [(p.stat().st_mtime, p.stat().st_size, p) for p in self._stored_outputs()]
        total = sum(size for _, size, _ in items)
        removed = freed = 0
        for _, size, path in sorted(items, key=lambda item: item[0]):
            if total <= max_bytes:
                break
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            total -= size
            removed += 1
            freed += size
        return {"removed": removed, "freed_bytes": freed, "remaining_bytes": total}

    def verify(self) -> dict[str, Any]:
        """Hash every entry's files against its record; damaged entries are deleted.
        `foreign`: items the cache did not make, left in place (they may be someone's)."""
        ok = removed = 0
        foreign = [str(p) for p in self.foreign()]
        for path in self._entries():
            try:
                result = json.loads((path / RESULT_FILE).read_text())
            except (OSError, ValueError):
                result = None
            if isinstance(result, dict) and _intact(path, result):
                ok += 1
            else:
                shutil.rmtree(path, ignore_errors=True)
                removed += 1
        return {"intact": ok, "removed": removed, "foreign": foreign}

    def put(self, key: str, files_dir: Path, result: dict[str, Any]) -> CacheEntry | None:
        """Move the files of `files_dir` into a new entry with `result`; returns the entry
        (None when the cache is disabled: the files stay where they are). Releases the
        key's claim."""
        if not self.enabled:
            return None
        try:
            return self._put(key, files_dir, result)
        finally:
            self._release(key)

    def _put(self, key: str, files_dir: Path, result: dict[str, Any]) -> CacheEntry | None:
        final = self._dir(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._sweep(final.parent)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=final.parent))
        try:
            files, digests = {}, {}
            for f in files_dir.iterdir():
                if f.is_file() and not f.is_symlink():
                    # Moved, not copied: the step's folder is discarded afterwards, and a
                    # 2 GB model should not be written twice (a copy only across devices).
                    shutil.move(str(f), tmp / f.name)
                    files[f.name] = (tmp / f.name).stat().st_size
                    digests[f.name] = file_sha256(tmp / f.name)
            record = {**result, "files": files, "sha256": digests}
            (tmp / RESULT_FILE).write_text(json.dumps(record, sort_keys=True, indent=1))
            if final.exists() and self.get(key) is None:
                shutil.rmtree(final, ignore_errors=True)  # a damaged entry: replace it
            try:
                os.rename(tmp, final)
            except OSError:  # another build stored the same key first: keep theirs
                shutil.rmtree(tmp, ignore_errors=True)
                return self.get(key)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return CacheEntry(final, record)  # just hashed while moving: not hashed again

    def _sweep(self, directory: Path) -> None:
        now = time.time()
        for stale in directory.glob(".tmp-*"):
            try:
                if now - stale.stat().st_mtime > STALE_TMP_SECONDS:
                    shutil.rmtree(stale, ignore_errors=True)
            except OSError:
                pass
