"""The SentencePiece model reader: protobuf's generated ModelProto, with damaged files refused as
ProtoError and the `tokenizer check` refusal naming the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.tokenizer.spm_proto import ModelType, PieceType, ProtoError, parse_model
from tests.bad_input.harness import refused


def test_a_trained_model_reads_its_piece_types_and_settings(oellm_like_spm: Path) -> None:
    model = parse_model(oellm_like_spm.read_bytes())
    assert model.model_type == ModelType.BPE and not model.has_precompiled_charsmap
    assert model.pieces[0].type == PieceType.UNKNOWN and model.pieces[0].piece == "<unk>"
    assert any(p.type == PieceType.NORMAL and p.score != 0.0 for p in model.pieces)


@pytest.mark.parametrize("cut", [1, 7, 100])
def test_a_truncated_model_is_a_proto_error(oellm_like_spm: Path, cut: int) -> None:
    data = oellm_like_spm.read_bytes()
    with pytest.raises(ProtoError):
        parse_model(data[:-cut] if cut < len(data) else data[:1])


def test_no_pieces_and_invalid_utf8_pieces() -> None:
    with pytest.raises(ProtoError, match="no pieces"):
        parse_model(b"")
    # one piece whose text is not UTF-8: read with replacement characters, not raised as bytes
    [piece] = parse_model(b"\x0a\x05\x0a\x03\xff\xfeA").pieces
    assert piece.piece == "\ufffd\ufffdA" and piece.type == PieceType.NORMAL


def test_check_refuses_a_truncated_model(
    tmp_path: Path, oellm_like_spm: Path, oellm_like_manifest: Path
) -> None:
    damaged = tmp_path / "tok" / "tokenizer.model"
    damaged.parent.mkdir()
    damaged.write_bytes(oellm_like_spm.read_bytes()[:-7])
    text = refused(
        ["tokenizer", "check", damaged, "-m", oellm_like_manifest],
        [tmp_path],
        needle="not a SentencePiece model",
    )
    assert "tokenizer.model" in text
