"""Load a tokenizer the way Megatron will see it: identity (md5), vocabulary size, special ids.

Three layouts are understood:

- `sentencepiece`: a bare `tokenizer.model` file (Megatron `GPTSentencePieceTokenizer`);
- `hf-sentencepiece`: a Hugging Face tokenizer directory holding `tokenizer.model` plus JSON side files
  (Megatron `HuggingFaceTokenizer`, whose vocabulary size is `len(tokenizer)`, added tokens included);
- `gpt2-bpe`: a directory with GPT-2 `vocab.json` + `merges.txt` (Megatron `GPT2BPETokenizer`).

Identity (`md5`) is the md5 of `tokenizer.model` for the first two, and the md5 of the bytes of
`vocab.json` followed by the bytes of `merges.txt` (one stream) for GPT-2. How text becomes ids is a
separate fact: `encode` goes through the backend of the tokenizer's `EncodingSpec` (the Megatron
tokenizer type, by default the one of the layout), exactly as Megatron-LM's `preprocess_data.py`
encodes (see `longctx.tokenizer.backend`); `encoding_fingerprint()` records that behaviour.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from longctx.errors import TokenizerError
from longctx.tokenizer.backend import GPT2_EOD, Backend, build_backend, fingerprint_backend
from longctx.tokenizer.encoding import EncodingFingerprint, EncodingSpec
from longctx.tokenizer.hf_files import SIDE_FILES, HfSideFiles, read_json, read_side_files
from longctx.tokenizer.spm_proto import PieceType, ProtoError, SpmModel, parse_model
from longctx.util.hashing import CHUNK, md5_file

Kind = Literal["sentencepiece", "hf-sentencepiece", "gpt2-bpe"]
KINDS: tuple[Kind, ...] = ("sentencepiece", "hf-sentencepiece", "gpt2-bpe")

MEGATRON_TOKENIZER_TYPE: dict[str, str] = {
    "sentencepiece": "GPTSentencePieceTokenizer",
    "hf-sentencepiece": "HuggingFaceTokenizer",
    "gpt2-bpe": "GPT2BPETokenizer",
}
MD5_OF: dict[str, str] = {
    "sentencepiece": "tokenizer.model",
    "hf-sentencepiece": "tokenizer.model",
    "gpt2-bpe": "vocab.json+merges.txt",
}
_SPECIAL_PIECE_TYPES = (PieceType.UNKNOWN, PieceType.CONTROL, PieceType.USER_DEFINED)


class LoadedTokenizer:
    """A tokenizer with the facts Megatron depends on.

    `vocab_size` is Megatron's view (`len(tokenizer)` for HF directories: model pieces plus added
    tokens with new ids); `model_vocab_size` counts only the model file's pieces. `encode` gives the ids
    Megatron-LM's tokenizer of `spec` gives (`add_bos=True` prepends BOS on top). `problems` lists
    inconsistencies found while loading (conflicting added-token declarations, gaps in ids, …);
    `backend_problems()` those between the files and the encoding backend; `verify` reports both.
    """

    path: Path
    kind: Kind
    md5: str
    md5_of: str
    identity_files: list[Path]
    model_vocab_size: int
    vocab_size: int
    added_tokens: dict[str, int]
    special_tokens: dict[str, int]
    bos_id: int | None
    eos_id: int | None
    pad_id: int | None
    unk_id: int | None
    encoder: str
    side_files: HfSideFiles | None
    problems: list[str]
    spec: EncodingSpec

    def __init__(self) -> None:
        self._sp: Any = None
        self._tk: Any = None
        self._id_to_added: dict[int, str] = {}
        self._backend: Backend | None = None
        self._fingerprint: EncodingFingerprint | None = None
        self._gpt2_vocab: dict[str, int] | None = None

    # -- facts -------------------------------------------------------------------------------------
    @property
    def eod_id(self) -> int | None:
        """End-of-document id Megatron appends (`<eos>` / `<|endoftext|>`)."""
        return self.eos_id

    @property
    def megatron_tokenizer_type(self) -> str:
        return self.spec.tokenizer_type

    @property
    def megatron_tokenizer_model(self) -> str:
        """The path Megatron's `--tokenizer-model` takes (unused for GPT-2, which takes vocab/merge files)."""
        return str(self.path)

    # -- text <-> ids ------------------------------------------------------------------------------
    @property
    def backend(self) -> Backend:
        """The encoder of `spec`, built on first use (HF directories load transformers)."""
        if self._backend is None:
            model = None
            if self._sp is not None:
                model = self.path if self.kind == "sentencepiece" else self.path / "tokenizer.model"
            hf_dir = self.path.is_dir() and (self.path / "tokenizer_config.json").is_file()
            self._backend = build_backend(
                self.spec, path=self.path, model_file=model, gpt2_vocab=self._gpt2_vocab, hf_dir=hf_dir
            )
        return self._backend

    def encoding_fingerprint(self) -> EncodingFingerprint:
        """What `spec` does with this tokenizer (probe ids, EOD, BOS, Megatron's vocabulary size)."""
        if self._fingerprint is None:
            self._fingerprint = fingerprint_backend(self.backend)
        return self._fingerprint

    def backend_problems(self) -> list[str]:
        """Where the encoding backend and the tokenizer files disagree (vocabulary size, EOD, BOS)."""
        b = self.backend
        out: list[str] = []
        if b.library == "transformers":
            if b.vocab_size != self.vocab_size:
                out.append(
                    f"transformers loads {b.vocab_size} tokens (len(tokenizer), what Megatron sizes the "
                    f"embedding by), but {self.md5_of} and the HF files declare {self.vocab_size}"
                )
            if b.eod_id != self.eos_id:
                out.append(
                    f"transformers' EOS (Megatron's EOD) is id {b.eod_id}, the files declare {self.eos_id}"
                )
        if b.eod_id is None:
            out.append(f"{self.spec.tokenizer_type} finds no EOS/EOD token in this tokenizer")
        return out

    def file_md5s(self) -> dict[str, str]:
        """md5 of every file this tokenizer is loaded from (model, vocabulary and HF JSON files)."""
        if self.path.is_file():
            return {self.path.name: md5_file(self.path)}
        names = ["tokenizer.model", "vocab.json", "merges.txt", *SIDE_FILES]
        return {n: md5_file(self.path / n) for n in names if (self.path / n).is_file()}

    def encoding_problems(self) -> list[str]:
        """The problems that make this tokenizer's encoding under `spec` untrustworthy: those of the files
        the backend reads (the HF side files only for HuggingFaceTokenizer) and `backend_problems()`."""
        files = (
            self.problems
            if self.spec.tokenizer_type == "HuggingFaceTokenizer" or self.kind == "gpt2-bpe"
            else []
        )
        return [*files, *self.backend_problems()]

    def with_spec(self, spec: EncodingSpec | str | None) -> LoadedTokenizer:
        """This tokenizer encoding through another spec (self when it is the same)."""
        wanted = _as_spec(spec, self.kind)
        return self if wanted == self.spec else load_tokenizer(self.path, spec=wanted)

    def encode(self, text: str, *, add_bos: bool = False) -> list[int]:
        return self.encode_batch([text], add_bos=add_bos)[0]

    def encode_batch(self, texts: Sequence[str], *, add_bos: bool = False) -> list[list[int]]:
        out = self.backend.encode_batch(list(texts))
        if add_bos:
            if self.bos_id is None:
                raise TokenizerError("this tokenizer has no BOS token", where=str(self.path))
            out = [[self.bos_id, *ids] for ids in out]
        return out

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.backend.library != "sentencepiece":
            return self.backend.decode(ids)
        # sentencepiece knows only its own pieces: decode runs of them, splice added tokens in between
        parts: list[str] = []
        run: list[int] = []
        for i in ids:
            if i >= self.model_vocab_size:
                if run:
                    parts.append(self._sp.decode(run))
                    run = []
                parts.append(self._id_to_added.get(i, ""))
            else:
                run.append(i)
        if run:
            parts.append(self._sp.decode(run))
        return "".join(parts)

    def encode_with_tokenizer_json(self, text: str) -> list[int] | None:
        """Encode with tokenizer.json itself (None without one), no special tokens added."""
        if self._tk is None or self.kind != "hf-sentencepiece":
            return None
        return list(self._tk.encode(text, add_special_tokens=False).ids)

    def encode_with_model_file(self, text: str) -> list[int] | None:
        """Encode with tokenizer.model itself (None for GPT-2)."""
        return None if self._sp is None else list(self._sp.encode(text))

    def token_to_id(self, token: str) -> int | None:
        if token in self.added_tokens:
            return self.added_tokens[token]
        if self._sp is not None:
            idx = int(self._sp.piece_to_id(token))
            if idx == self._sp.unk_id() and self._sp.id_to_piece(idx) != token:
                return None
            return idx
        idx = self._tk.token_to_id(token)
        return None if idx is None else int(idx)

    def id_to_token(self, idx: int) -> str | None:
        if idx in self._id_to_added:
            return self._id_to_added[idx]
        if not 0 <= idx < self.model_vocab_size:
            return None
        if self._sp is not None:
            return str(self._sp.id_to_piece(idx))
        tok = self._tk.id_to_token(idx)
        return None if tok is None else str(tok)

    def __reduce__(self) -> tuple[Any, tuple[Path, EncodingSpec]]:
        # worker processes reload from disk rather than pickling native tokenizer objects
        return (load_tokenizer, (self.path, self.spec))

    def __repr__(self) -> str:
        return (
            f"LoadedTokenizer(kind={self.kind!r}, path={str(self.path)!r}, vocab_size={self.vocab_size}, "
            f"eod_id={self.eod_id}, md5={self.md5!r}, encoding={self.spec.describe()!r})"
        )


# -- loading ----------------------------------------------------------------------------------------
def _as_spec(spec: EncodingSpec | str | None, kind: Kind) -> EncodingSpec:
    if spec is None:
        return EncodingSpec(MEGATRON_TOKENIZER_TYPE[kind])
    return EncodingSpec(spec) if isinstance(spec, str) else spec


def load_tokenizer(path: str | os.PathLike[str], spec: EncodingSpec | str | None = None) -> LoadedTokenizer:
    """Load a `tokenizer.model`, an HF tokenizer directory, or a GPT-2 vocab.json+merges.txt directory.

    `spec` is how Megatron-LM encodes with it (a tokenizer type or an `EncodingSpec`); by default the
    type of the layout (`MEGATRON_TOKENIZER_TYPE`). Nothing is encoded until `encode` is called.
    """
    tok = _load_files(path)
    tok.spec = _as_spec(spec, tok.kind)
    return tok


def _load_files(path: str | os.PathLike[str]) -> LoadedTokenizer:
    p = Path(path)
    if not p.exists():
        raise TokenizerError(
            f"tokenizer not found: {p}",
            where=str(p),
            fix="pass a tokenizer.model file, an HF tokenizer directory, or a directory with vocab.json + merges.txt",
        )
    if p.is_file() and p.name in ("vocab.json", "merges.txt"):
        p = p.parent
    if p.is_file():
        return _load_sentencepiece_file(p)
    if (p / "tokenizer.model").is_file():
        return _load_hf_sentencepiece(p)
    if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
        return _load_gpt2(p)
    hf_present = [
        name
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        if (p / name).is_file()
    ]
    if hf_present:
        raise TokenizerError(
            f"HF tokenizer directory has no tokenizer.model (found {', '.join(hf_present)})",
            where=str(p),
            fix="copy tokenizer.model from the original tokenizer into this directory; its md5 defines "
            "the tokenizer's identity and checkpoint conversion needs it",
        )
    raise TokenizerError(
        "no tokenizer files in directory (expected tokenizer.model, or vocab.json + merges.txt)",
        where=str(p),
        fix="point at the tokenizer directory itself",
    )


def _require_nonempty(path: Path) -> None:
    if path.stat().st_size == 0:
        raise TokenizerError(
            f"tokenizer file is empty: {path.name}",
            where=str(path),
            fix="the copy was interrupted or truncated; copy the file again from its source",
        )


def _read_spm(path: Path) -> tuple[Any, SpmModel]:
    import sentencepiece as spm  # lazy: a native library that only SentencePiece tokenizers need

    _require_nonempty(path)
    data = path.read_bytes()
    try:
        proto = parse_model(data)
        sp = spm.SentencePieceProcessor(model_proto=data)
    except (ProtoError, RuntimeError, OSError, ValueError) as err:
        raise TokenizerError(
            f"not a SentencePiece model: {path.name} cannot be parsed as a SentencePiece ModelProto ({err})",
            where=str(path),
            fix="pass the tokenizer.model file (binary protobuf) of the tokenizer, or its HF directory",
        ) from None
    return sp, proto


def _init_sentencepiece(tok: LoadedTokenizer, model_path: Path) -> None:
    sp, proto = _read_spm(model_path)
    tok._sp = sp
    tok.md5 = md5_file(model_path)
    tok.md5_of = "tokenizer.model"
    tok.identity_files = [model_path]
    tok.model_vocab_size = int(sp.get_piece_size())
    tok.special_tokens = {
        piece.piece: idx for idx, piece in enumerate(proto.pieces) if piece.type in _SPECIAL_PIECE_TYPES
    }
    tok.bos_id = _opt_id(sp.bos_id())
    tok.eos_id = _opt_id(sp.eos_id())
    tok.pad_id = _opt_id(sp.pad_id())
    tok.unk_id = _opt_id(sp.unk_id())
    tok.encoder = "sentencepiece"
    tok.added_tokens = {}
    tok.side_files = None
    tok.problems = []
    tok.vocab_size = tok.model_vocab_size


def _opt_id(value: int) -> int | None:
    return None if value < 0 else int(value)


def _load_sentencepiece_file(path: Path) -> LoadedTokenizer:
    tok = LoadedTokenizer()
    tok.path = path
    tok.kind = "sentencepiece"
    _init_sentencepiece(tok, path)
    return tok


def _load_hf_sentencepiece(directory: Path) -> LoadedTokenizer:
    tok = LoadedTokenizer()
    tok.path = directory
    tok.kind = "hf-sentencepiece"
    _init_sentencepiece(tok, directory / "tokenizer.model")
    side = read_side_files(directory)
    tok.side_files = side
    problems = list(side.conflicts)
    base = tok.model_vocab_size

    if "tokenizer.json" in side.present:
        tok._tk = _load_tokenizer_json(directory / "tokenizer.json")
        tok.encoder = "tokenizer.json"
        json_base = int(tok._tk.get_vocab_size(with_added_tokens=False))
        if json_base != base:
            problems.append(
                f"tokenizer.json has {json_base} model tokens but tokenizer.model has {base} pieces"
            )

    added: dict[str, int] = {}
    for content, idx in side.added_tokens.items():
        if idx < base:
            piece = tok._sp.id_to_piece(idx)
            if piece != content:
                problems.append(
                    f"added token {content!r} is declared at id {idx}, but id {idx} is {piece!r} in tokenizer.model"
                )
            continue
        added[content] = idx
    tok.added_tokens = dict(sorted(added.items(), key=lambda kv: kv[1]))
    tok._id_to_added = {v: k for k, v in tok.added_tokens.items()}
    ids = set(tok.added_tokens.values())
    tok.vocab_size = base + len(ids)
    if ids and max(ids) >= tok.vocab_size:
        problems.append(
            f"added token ids leave a gap: len(tokenizer) = {tok.vocab_size} but the largest id is {max(ids)} "
            "(Megatron sizes the embedding by len(tokenizer), so that id would be out of range)"
        )

    # named specials (bos/eos/pad/unk) as the HF files declare them override the model's own
    for key, content in side.named_specials.items():
        idx = tok.token_to_id(content)
        if idx is None:
            problems.append(f"{key} {content!r} (from the JSON files) is not a token of this tokenizer")
            continue
        setattr(tok, key.replace("_token", "_id"), idx)
        tok.special_tokens.setdefault(content, idx)
    for content in side.additional_special_tokens:
        idx = tok.token_to_id(content)
        if idx is None:
            problems.append(f"additional special token {content!r} is not a token of this tokenizer")
        else:
            tok.special_tokens.setdefault(content, idx)
    for content, idx in tok.added_tokens.items():
        tok.special_tokens.setdefault(content, idx)
    tok.special_tokens = dict(sorted(tok.special_tokens.items(), key=lambda kv: kv[1]))
    if "tokenizer_config.json" not in side.present:
        problems.append(
            "no tokenizer_config.json: Megatron's HuggingFaceTokenizer (AutoTokenizer) cannot load this directory"
        )
    tok.problems = problems
    return tok


def _load_tokenizer_json(path: Path) -> Any:
    from tokenizers import Tokenizer  # lazy: the native library only where a tokenizer.json is loaded

    _require_nonempty(path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # the Rust side raises plain Exception subclasses
        raise TokenizerError(
            f"tokenizer.json cannot be loaded by the tokenizers library ({err})",
            where=str(path),
            fix="restore tokenizer.json from the original tokenizer, or remove it to use tokenizer.model",
        ) from None


def _load_gpt2(directory: Path) -> LoadedTokenizer:
    # lazy: the `tokenizers` native library only for GPT-2 BPE tokenizers
    from tokenizers import Tokenizer, decoders, pre_tokenizers
    from tokenizers.models import BPE

    vocab_path, merges_path = directory / "vocab.json", directory / "merges.txt"
    _require_nonempty(vocab_path)
    _require_nonempty(merges_path)
    vocab = read_json(vocab_path)
    if not isinstance(vocab, dict) or not all(isinstance(v, int) for v in vocab.values()):
        raise TokenizerError(
            "vocab.json is not a GPT-2 vocabulary (an object of token -> integer id)",
            where=str(vocab_path),
            fix="pass the GPT-2 vocab.json of the tokenizer",
        )
    try:
        bpe = BPE.from_file(str(vocab_path), str(merges_path))
    except Exception as err:
        raise TokenizerError(
            f"vocab.json + merges.txt cannot be loaded as a byte-level BPE ({err})",
            where=str(directory),
            fix="restore vocab.json and merges.txt from the original tokenizer",
        ) from None
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()

    tok = LoadedTokenizer()
    tok.path = directory
    tok.kind = "gpt2-bpe"
    tok._tk = tk
    tok._gpt2_vocab = vocab
    tok.encoder = "bpe"
    tok.md5 = _md5_concat([vocab_path, merges_path])
    tok.md5_of = MD5_OF["gpt2-bpe"]
    tok.identity_files = [vocab_path, merges_path]
    tok.model_vocab_size = len(vocab)
    tok.vocab_size = len(vocab)  # Megatron's GPT2BPETokenizer: len(encoder)
    tok.added_tokens = {}
    tok.side_files = None
    problems: list[str] = []
    ids = set(vocab.values())
    if len(ids) != len(vocab) or (ids and max(ids) != len(vocab) - 1):
        problems.append("vocab.json ids are not 0..N-1 without duplicates")
    eod = vocab.get(GPT2_EOD)
    if eod is None:
        problems.append(f"vocab.json has no {GPT2_EOD} token (Megatron's GPT2BPETokenizer uses it as EOD)")
    tok.special_tokens = {GPT2_EOD: eod} if eod is not None else {}
    tok.bos_id = tok.eos_id = eod
    tok.pad_id = None
    tok.unk_id = None
    tok.problems = problems
    return tok


def _md5_concat(paths: list[Path]) -> str:
    h = hashlib.md5()
    for path in paths:
        with open(path, "rb", buffering=0) as fh:
            while chunk := fh.read(CHUNK):
                h.update(chunk)
    return h.hexdigest()


def tokenizer_md5(path: str | os.PathLike[str]) -> str:
    """The identity md5 of a tokenizer path, without loading it (see the module docstring)."""
    p = Path(path)
    if p.is_file() and p.name in ("vocab.json", "merges.txt"):
        p = p.parent
    if p.is_dir():
        if (p / "tokenizer.model").is_file():
            return md5_file(p / "tokenizer.model")
        if (p / "vocab.json").is_file() and (p / "merges.txt").is_file():
            return _md5_concat([p / "vocab.json", p / "merges.txt"])
        return _load_files(p).md5  # raises the specific error
    if not p.exists():
        return _load_files(p).md5
    return md5_file(p)
