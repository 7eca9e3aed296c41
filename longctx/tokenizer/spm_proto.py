"""Read the few fields of a SentencePiece model file that the Python API does not expose.

`tokenizer.model` is a serialized protobuf `ModelProto`. We need each piece's type (to tell
user-defined tokens such as `<start_of_turn>` from ordinary ones) and a few trainer/normalizer
settings; sentencepiece ships the generated message class, which protobuf parses.
"""

from __future__ import annotations

import dataclasses
from enum import IntEnum

from google.protobuf.message import DecodeError
from sentencepiece import sentencepiece_model_pb2


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
    """The bytes are not a well-formed SentencePiece ModelProto."""


def _piece_type(value: int) -> PieceType:
    # a type this reader does not know counts as an ordinary piece
    return PieceType(value) if value in PieceType._value2member_map_ else PieceType.NORMAL


def _text(value: str | bytes) -> str:
    # protobuf hands back the raw bytes of a proto2 string field that is not valid UTF-8
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value


def parse_model(data: bytes) -> SpmModel:
    """Parse a serialized SentencePiece ModelProto."""
    proto = sentencepiece_model_pb2.ModelProto()
    try:
        proto.ParseFromString(data)
    except DecodeError as err:
        raise ProtoError(str(err) or "malformed protobuf") from None
    if not proto.pieces:
        raise ProtoError("no pieces")
    trainer, normalizer = proto.trainer_spec, proto.normalizer_spec
    model_type = trainer.model_type
    return SpmModel(
        pieces=[SpmPiece(_text(p.piece), p.score, _piece_type(p.type)) for p in proto.pieces],
        model_type=ModelType(model_type) if model_type in ModelType._value2member_map_ else ModelType.UNIGRAM,
        add_dummy_prefix=normalizer.add_dummy_prefix,
        remove_extra_whitespaces=normalizer.remove_extra_whitespaces,
        normalizer_name=_text(normalizer.name),
        has_precompiled_charsmap=len(normalizer.precompiled_charsmap) > 0,
        split_by_whitespace=trainer.split_by_whitespace,
    )
