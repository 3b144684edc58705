"""A Hugging Face model folder from outside: no code from it, its JSON read within bounds.

transformers runs a folder's own Python when a config names classes in `auto_map` (after a
`[y/N]` prompt on a terminal, or when told `trust_remote_code=True`). This tool never does:
every transformers load passes `trust_remote_code=False` (`TRUST_REMOTE_CODE`), and a folder
that ships code (`auto_map` in a config, or any Python file) is refused up front with one
line, so no prompt appears and stdin is never read. The JSON files transformers reads from a
folder are read here first within the bounds of `untrusted`, so a 300 MB or 200k-deep
config.json is a one-line error rather than a hang or a RecursionError.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from winml_recipes.untrusted import UntrustedInputError, printable, read_json_bounded

# Passed explicitly to every transformers from_pretrained: never run a model's own code.
TRUST_REMOTE_CODE = False

# Files Python would import or run.
CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".pyd")
# The JSON files transformers reads from a model folder for a config, model, tokenizer or
# processor; each that exists is read (bounded) and checked for `auto_map` first.
CONFIG_FILES = (
    "config.json",
    "generation_config.json",
    "preprocessor_config.json",
    "processor_config.json",
    "video_preprocessor_config.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "adapter_config.json",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)
# A model folder holds a few dozen files; walking more is work an attacker chose.
MAX_ENTRIES = 10_000


def refuse_auto_map(data: dict[str, Any], path: Path | str) -> None:
    """One line when a config names code classes (`auto_map`) transformers would import."""
    auto_map = data.get("auto_map")
    if auto_map:
        names = ", ".join(sorted(auto_map)) if isinstance(auto_map, dict) else "classes"
        raise UntrustedInputError(
            f"{printable(path)}: auto_map ({printable(names)[:120]}) names the model's own "
            "Python code, which winml-recipes never runs; use a model whose architecture "
            "transformers ships (no auto_map)"
        )


def check_folder(folder: Path) -> dict[str, dict[str, Any]]:
    """Refuse a model folder that ships code; return its config files, read within bounds.

    `config.json` must exist. The folder is walked without following links to folders, at
    most `MAX_ENTRIES` entries.
    """
    config = folder / "config.json"
    if not os.path.lexists(config):
        raise UntrustedInputError(
            f"{printable(folder)}: has no config.json; not a Hugging Face model folder"
        )
    code = _first_code_file(folder)
    if code is not None:
        raise UntrustedInputError(
            f"{printable(folder)}: holds Python code ({printable(code)}); winml-recipes never "
            "runs code from a model folder, remove it or use a folder with only configs, "
            "weights and tokenizer files"
        )
    configs: dict[str, dict[str, Any]] = {}
    for name in CONFIG_FILES:
        path = folder / name
        if name == "config.json" or os.path.lexists(path):
            configs[name] = read_json_bounded(path)
            refuse_auto_map(configs[name], path)
    return configs


def check_config_file(path: Path) -> dict[str, Any]:
    """A config file fetched on its own (a Hub repo's config.json): bounded, no `auto_map`."""
    data = read_json_bounded(path)
    refuse_auto_map(data, path)
    return data


def _first_code_file(folder: Path) -> str | None:
    """The first Python file under `folder` (relative, '/'-separated), or None."""
    seen = 0
    pending = [folder]
    while pending:
        current = pending.pop()
        try:
            entries = os.scandir(current)
        except OSError as exc:
            raise UntrustedInputError(
                f"{printable(current)}: cannot list ({exc.strerror})"
            ) from None
        with entries:
            for entry in entries:
                seen += 1
                if seen > MAX_ENTRIES:
                    raise UntrustedInputError(
                        f"{printable(folder)}: more than {MAX_ENTRIES:,} files and folders; "
                        "a model folder holds a few dozen, refused"
                    )
                if entry.name.lower().endswith(CODE_SUFFIXES):
                    return Path(entry.path).relative_to(folder).as_posix()
                if _is_real_dir(entry):
                    pending.append(Path(entry.path))
    return None


def _is_real_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return stat.S_ISDIR(entry.stat(follow_symlinks=False).st_mode)
    except OSError:
        return False
