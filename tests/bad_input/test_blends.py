"""Megatron blends (`--data-path` text and `--data-args-path` files) that cannot be what the user meant."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bad_input.harness import refused

BLENDS = [
    ("0.5 {p} 0.5", "odd"),
    ("-1 {p}", "weight"),
    ("nan {p} 1 {p}", "weight"),
    ("inf {p}", "weight"),
    ("0 {p}", "weight"),
    ("1 {missing}", "missing"),
    ("1 {p}.bin", ".bin"),
]


@pytest.mark.parametrize(("blend", "needle"), BLENDS, ids=[b for b, _ in BLENDS])
def test_bad_blend_text(blend: str, needle: str, oellm_like_dataset: object, tmp_path: Path) -> None:
    prefix = str(oellm_like_dataset)
    text = blend.format(p=prefix, missing=tmp_path / "nowhere" / "ds")
    refused(["data", "check", "--data-path", text], [tmp_path, Path(prefix).parent], needle=needle)


ARGS_FILES = {
    "not-utf8": (b"1 /data/\xff\xfe\n", "UTF-8"),
    "empty": (b"\n\n", "empty"),
    "binary": (bytes(range(1, 256)), "UTF-8"),
}


@pytest.mark.parametrize("case", sorted(ARGS_FILES))
def test_bad_data_args_file(case: str, tmp_path: Path) -> None:
    content, needle = ARGS_FILES[case]
    f = tmp_path / "mix.txt"
    f.write_bytes(content)
    refused(["data", "check", "--data-args-path", f], [tmp_path], needle=needle)


def test_data_args_path_is_a_directory(tmp_path: Path) -> None:
    refused(["data", "check", "--data-args-path", tmp_path], [tmp_path], needle=str(tmp_path))
