"""Sample inputs for passes: synthetic feeds from the I/O contract, npz files, images
(bundled or a folder), Hugging Face dataset splits, the upstream component's outputs
(inputs_from), a two-tower model's label prompts (labelprompts.py), and how a pass names
and digests its data for the manifest and the key.

A facade over feeds.py, hfdata.py and labelprompts.py (see services/models.py for why
passes import from here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the names, for type checkers and editors
    from winml_recipes.feeds import (
        UpstreamFeeds,
        bundled_audio_input,
        bundled_image_input,
        check_npz,
        check_npz_values,
        describe_source,
        feeds_for,
        image_files,
        npz_files,
        outputs_for,
        store_outputs,
        synthetic,
        take,
        upstream_data_digest,
    )
    from winml_recipes.hfdata import check_split, open_split
    from winml_recipes.labelprompts import PROMPTS, prompt_feeds, source_folder

__all__ = [
    "PROMPTS",
    "UpstreamFeeds",
    "bundled_audio_input",
    "bundled_image_input",
    "check_npz",
    "check_npz_values",
    "check_split",
    "describe_source",
    "feeds_for",
    "image_files",
    "npz_files",
    "open_split",
    "outputs_for",
    "prompt_feeds",
    "source_folder",
    "store_outputs",
    "synthetic",
    "take",
    "upstream_data_digest",
]


def __getattr__(name: str) -> Any:
    """The implementation of `name`, imported when first asked for."""
    if name in (
        "UpstreamFeeds",
        "bundled_audio_input",
        "bundled_image_input",
        "check_npz",
        "check_npz_values",
        "describe_source",
        "feeds_for",
        "image_files",
        "npz_files",
        "outputs_for",
        "store_outputs",
        "synthetic",
        "take",
        "upstream_data_digest",
    ):
        from winml_recipes import feeds as module

        return getattr(module, name)
    if name in ("PROMPTS", "prompt_feeds", "source_folder"):
        from winml_recipes import labelprompts as module

        return getattr(module, name)
    if name in ("check_split", "open_split"):
        from winml_recipes import hfdata as module

        return getattr(module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
