"""Label prompts a two-tower model's text tower encodes for zero-shot image classification:
prompts naming the subjects of the bundled held-out photos plus distractors, as text,
turned into the text tower's inputs by the model folder's tokenizer where it ships one,
else into word ids (a stable hash of each word into the vocabulary, between the config's
bos and eos ids): a random-weight model has no trained tokenizer, and the same prompt
gives the same ids on every host."""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from winml_recipes.sdk.contract import IOContract

PROMPTS = (
    "a photo of a cat",
    "a photo of coins",
    "a rocket on a launch pad",
    "printed text",
    "an eye's retina",
    "a street at night",
    "a bowl of soup",
    "a mountain lake",
)
TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "spiece.model", "tokenizer_config.json")


def _length(contract: IOContract) -> int:
    ids = next(s for s in contract.inputs if s.name == "input_ids")
    fixed = ids.shape[-1] if ids.shape and isinstance(ids.shape[-1], int) else None
    return int(fixed or contract.dims.get("sequence", 16))


def _word_ids(prompt: str, length: int, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    words = [3 + zlib.crc32(w.encode()) % (vocab - 3) for w in prompt.split()][: length - 2]
    ids = np.zeros(length, np.int64)
    ids[0], ids[1 : len(words) + 1], ids[len(words) + 1] = 1, words, 2
    mask = (np.arange(length) <= len(words) + 1).astype(np.int64)
    return ids, mask


def _tokenizer(folder: Path | None) -> Any:
    """The folder's tokenizer (transformers, no code run), None where it has none."""
    if folder is None or not any((folder / f).is_file() for f in TOKENIZER_FILES):
        return None
    from transformers import AutoTokenizer

    from winml_recipes.console import quiet_stdout

    with quiet_stdout():
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=False)


def prompt_feeds(
    prompts: Sequence[str], contract: IOContract, folder: Path | None = None
) -> list[dict[str, np.ndarray]]:
    """Each prompt as the text tower's feed (batch 1), padded to the contract's length."""
    length = _length(contract)
    ids_spec = next(s for s in contract.inputs if s.name == "input_ids")
    vocab = int(ids_spec.range[1]) if ids_spec.range else 100
    tokenizer = _tokenizer(folder)
    feeds = []
    for prompt in prompts:
        if tokenizer is not None:
            enc = tokenizer(prompt, padding="max_length", truncation=True, max_length=length)
            ids = np.asarray(enc["input_ids"], np.int64)
            mask = np.asarray(enc.get("attention_mask", np.ones(length)), np.int64)
        else:
            ids, mask = _word_ids(prompt, length, vocab)
        feed = {"input_ids": ids[None], "attention_mask": mask[None]}
        feeds.append({s.name: feed[s.name] for s in contract.inputs})
    return feeds


def source_folder(export: Any) -> Path | None:
    """The local model folder a component is exported from (None: a Hub id or a config)."""
    model_id = (export or {}).get("model_id") if hasattr(export, "get") else None
    path = Path(model_id) if model_id else None
    return path if path is not None and path.is_dir() else None
