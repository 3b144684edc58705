"""Bounded JSON and escaped text: the rules every file and response from outside follows."""

from __future__ import annotations

from pathlib import Path

import pytest

from winml_recipes.untrusted import (
    UntrustedInputError,
    loads_bounded,
    printable,
    read_json_bounded,
)


def test_printable_escapes_what_could_forge_or_recolor_a_line():
    assert printable("m.onnx\nOK: forged\x1b[2J\u202e") == "m.onnx\\nOK: forged\\x1b[2J\\u202e"
    assert printable("plain/path-ü.onnx") == "plain/path-ü.onnx"


def test_deep_json_is_refused_before_the_parser_recurses():
    with pytest.raises(UntrustedInputError, match="nested more than 64"):
        loads_bounded("[" * 200_000 + "]" * 200_000, "state.json")
    # brackets inside strings are not nesting
    assert loads_bounded('{"a": "[[[[[[[[[[[[[[[["}', "x", max_depth=2) == {"a": "[" * 16}


def test_large_json_file_is_refused_without_reading_it(tmp_path):
    path = tmp_path / "config.json"
    path.write_bytes(b'{"a": "' + b"x" * 2048 + b'"}')
    with pytest.raises(UntrustedInputError, match="more than the 1,024"):
        read_json_bounded(path, max_bytes=1024)


def test_wrong_top_level_type_is_named(tmp_path):
    path = tmp_path / "dataset_info.json"
    path.write_text("[1, 2]")
    with pytest.raises(UntrustedInputError, match="expected a JSON object, found array"):
        read_json_bounded(path)


@pytest.mark.skipif(not Path("/dev/zero").exists(), reason="needs /dev/zero (Linux CI)")
def test_a_link_to_an_endless_device_is_refused_before_opening(tmp_path):
    path = tmp_path / "config.json"
    path.symlink_to("/dev/zero")
    with pytest.raises(UntrustedInputError, match="not a regular file"):
        read_json_bounded(path)
