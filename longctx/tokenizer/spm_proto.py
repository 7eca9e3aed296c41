"""Read the few fields of a SentencePiece model file that the Python API does not expose.

`tokenizer.model` is a serialized protobuf `ModelProto`. We need each piece's type (to tell
user-defined tokens such as `<start_of_turn>` from ordinary ones) and a few trainer/normalizer
settings; a small wire-format reader avoids depending on `protobuf` for that.
"""

from __future__ import annotations

import dataclasses
import struct
from enum import IntEnum


class PieceType(IntEnum):
    NORMAL = 1
    UNKNOWN = 2
    CONTROL = 3
    USER_DEFINED = 4
    UNUSED = 5
    BYTE = 6


class ModelType(IntEnum):
    UNIGRAM = 1
    BPE = 2
    WORD = 3
    CHAR = 4


@dataclasses.dataclass
class SpmPiece:
    piece: str
    score: float
    type: PieceType


@dataclasses.dataclass
class SpmModel:
    pieces: list[SpmPiece]
    model_type: ModelType
    add_dummy_prefix: bool
    remove_extra_whitespaces: bool
    normalizer_name: str
    has_precompiled_charsmap: bool
    split_by_whitespace: bool


class ProtoError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise ProtoError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ProtoError("varint too long")


def _fields(buf: bytes) -> list[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of one message."""
    out: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        field, wire = key >> 3, key & 7
        if field == 0:
            raise ProtoError("field number 0")
        value: int | bytes
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire == 1:
            if pos + 8 > len(buf):
                raise ProtoError("truncated fixed64")
            value, pos = int.from_bytes(buf[pos : pos + 8], "little"), pos + 8
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise ProtoError("truncated length-delimited field")
            value, pos = bytes(buf[pos : pos + n]), pos + n
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ProtoError("truncated fixed32")
            value, pos = int.from_bytes(buf[pos : pos + 4], "little"), pos + 4
        else:
            raise ProtoError(f"unsupported wire type {wire}")
        out.append((field, wire, value))
    return out


def parse_model(data: bytes) -> SpmModel:
    """Parse a serialized SentencePiece ModelProto (field numbers from sentencepiece_model.proto)."""
    pieces: list[SpmPiece] = []
    model_type = ModelType.UNIGRAM
    split_by_whitespace = True
    add_dummy_prefix = True
    remove_extra = True
    name = ""
    charsmap = False
    for field, wire, value in _fields(data):
        if field == 1 and wire == 2:  # pieces
            assert isinstance(value, bytes)
            piece, score, ptype = "", 0.0, PieceType.NORMAL
            for f, w, v in _fields(value):
                if f == 1 and w == 2:
                    assert isinstance(v, bytes)
                    piece = v.decode("utf-8", errors="replace")
                elif f == 2 and w == 5:
                    assert isinstance(v, int)
                    score = struct.unpack("<f", v.to_bytes(4, "little"))[0]
                elif f == 3 and w == 0:
                    assert isinstance(v, int)
                    ptype = PieceType(v) if v in PieceType._value2member_map_ else PieceType.NORMAL
            pieces.append(SpmPiece(piece, score, ptype))
        elif field == 2 and wire == 2:  # trainer_spec
            assert isinstance(value, bytes)
            for f, w, v in _fields(value):
                if f == 3 and w == 0 and isinstance(v, int) and v in ModelType._value2member_map_:
                    model_type = ModelType(v)
                elif f == 22 and w == 0:
                    split_by_whitespace = bool(v)
        elif field == 3 and wire == 2:  # normalizer_spec
            assert isinstance(value, bytes)
            for f, w, v in _fields(value):
                if f == 1 and w == 2 and isinstance(v, bytes):
                    name = v.decode("utf-8", errors="replace")
                elif f == 2 and w == 2 and isinstance(v, bytes):
                    charsmap = len(v) > 0
                elif f == 3 and w == 0:
                    add_dummy_prefix = bool(v)
                elif f == 4 and w == 0:
                    remove_extra = bool(v)
    if not pieces:
        raise ProtoError("no pieces")
    return SpmModel(
        pieces=pieces,
        model_type=model_type,
        add_dummy_prefix=add_dummy_prefix,
        remove_extra_whitespaces=remove_extra,
        normalizer_name=name,
        has_precompiled_charsmap=charsmap,
        split_by_whitespace=split_by_whitespace,
    )
