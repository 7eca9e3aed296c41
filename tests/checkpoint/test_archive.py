"""The archive index's one rule for what a member name means."""

from __future__ import annotations

import pytest

from longctx.checkpoint.archive import UnsafeName, member_path

SAME = {
    "ckpt/iter_0000005/common.pt": "ckpt/iter_0000005/common.pt",
    "./ckpt/common.pt": "ckpt/common.pt",
    "././ckpt//common.pt": "ckpt/common.pt",
    "ckpt/./common.pt": "ckpt/common.pt",
    "ckpt\\common.pt": "ckpt/common.pt",
    "ckpt/": "ckpt",
    "./": "",
    ".": "",
    "": "",
}


@pytest.mark.parametrize("raw", sorted(SAME))
def test_member_path_normalises_every_spelling(raw: str) -> None:
    assert member_path(raw) == SAME[raw]
    assert member_path(member_path(raw)) == member_path(raw)  # what adopt checks again before writing


REFUSED = {
    "/etc/passwd": "absolute path",
    "\\etc\\passwd": "absolute path",
    "C:evil": "absolute path",
    "ckpt/../../x": "'..'",
    "ckpt\\..\\..\\x": "'..'",
    "ckpt/a\x00b": "NUL byte",
    "ckpt/a\rb": "control character",
    "ckpt/a\x7fb": "control character",
    "ckpt/\udcff": "not valid UTF-8",
    "ckpt/" + "é" * 128: "255 bytes",  # 256 bytes in UTF-8, though 128 characters
    "d/" * 2048: "4,095",
}


@pytest.mark.parametrize("raw", sorted(REFUSED))
def test_member_path_refuses_what_a_file_system_cannot_hold(raw: str) -> None:
    with pytest.raises(UnsafeName, match=REFUSED[raw]):
        member_path(raw)
