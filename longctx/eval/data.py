"""Held-out documents for the loss evaluations, from Megatron indexed datasets.

Held out means what the stage's training never sees: Megatron's GPTDataset trains on sequences
[0, round(train_share · N)) of each prefix (its split matrix, `--split`), so the sequences from
there on (validation + test shares) are held out. Prefixes given explicitly (`--data`) are treated
as entirely unseen.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from megatron.core.datasets.blended_megatron_dataset_config import parse_and_normalize_split
from megatron.core.datasets.indexed_dataset import IndexedDataset

from longctx.data.indexed import EMPTY_FIX, no_tokens_message, read_index
from longctx.errors import DatasetError, EvalError
from longctx.plan.derive import ResolvedPlan, ResolvedStage
from longctx.plan.stage_data import stage_blend


def train_end(n_sequences: int, split: str) -> int:
    """First held-out sequence index under Megatron's split semantics."""
    try:
        shares = parse_and_normalize_split(split)
    except (AssertionError, ValueError, ZeroDivisionError) as err:
        raise EvalError(
            f"cannot parse the data split {split!r}", fix="give it as Megatron does, e.g. 98,2,0"
        ) from err
    return round(shares[0] * float(n_sequences))


@dataclasses.dataclass
class HeldOut:
    """Held-out sequences of one or more prefixes (`split=None`: the whole prefix is held out)."""

    prefixes: list[str]
    split: str | None = None
    _datasets: list[IndexedDataset] = dataclasses.field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.prefixes:
            raise EvalError(
                "no data to take held-out documents from", fix="give the plan's data or --data PREFIX"
            )
        for p in self.prefixes:
            if not (Path(p + ".idx").is_file() and Path(p + ".bin").is_file()):
                raise EvalError(
                    "indexed dataset not found (PREFIX.idx / PREFIX.bin)",
                    where=p,
                    fix="tokenize the data first (longctx data tokenize) or pass the right --data prefix",
                )
            self._require_tokens(p)
            self._datasets.append(IndexedDataset(p, mmap=True))

    @staticmethod
    def _require_tokens(prefix: str) -> None:
        """A dataset without a token is refused before megatron-core maps its (empty) .bin, which it
        cannot, and before a loop waits for tokens from it."""
        try:
            info = read_index(prefix)
        except DatasetError as err:
            raise EvalError(
                f"cannot read the held-out data: {err.what}", where=err.where, fix=err.fix
            ) from None
        if info.tokens == 0:
            raise EvalError(
                f"{no_tokens_message(Path(prefix).name, info.documents)}: nothing to evaluate on",
                where=prefix,
                fix=f"{EMPTY_FIX} (or pass other data with --data)",
            )

    def identity(self) -> str:
        """Changes when the held-out documents could (paths, split, index sizes)."""
        parts = [f"split={self.split}"]
        for p in self.prefixes:
            parts.append(
                f"{Path(p).resolve()}:{Path(p + '.idx').stat().st_size}:{Path(p + '.bin').stat().st_size}"
            )
        return "|".join(parts)

    def _ranges(self) -> Iterator[tuple[IndexedDataset, int, int]]:
        for ds in self._datasets:
            n = len(ds.sequence_lengths)
            start = 0 if self.split is None else train_end(n, self.split)
            yield ds, start, n

    def count(self) -> int:
        return sum(n - s for _, s, n in self._ranges())

    def _require_some(self) -> None:
        if self.count() == 0:
            raise EvalError(
                f"the split {self.split!r} holds out no documents of {', '.join(self.prefixes)}",
                fix='give the stage data a validation share (e.g. split = "98,2,0") or pass unseen data with --data',
            )

    def long_documents(self, length: int, count: int) -> tuple[list[np.ndarray], bool]:
        """`count` sequences of exactly `length` tokens: the first `length` tokens of held-out
        documents at least that long (position = position in the document). When there are none,
        held-out documents are packed back to back as Megatron's samples are (second value True)."""
        self._require_some()
        docs: list[np.ndarray] = []
        for ds, s, n in self._ranges():
            lengths = ds.sequence_lengths
            for i in range(s, n):
                if int(lengths[i]) >= length:
                    docs.append(np.asarray(ds[i][:length], dtype=np.int64))
                    if len(docs) == count:
                        return docs, False
        if docs:
            return docs, False
        stream: list[np.ndarray] = []
        have = 0
        for ds, s, n in self._ranges():
            for i in range(s, n):
                stream.append(np.asarray(ds[i], dtype=np.int64))
                have += len(stream[-1])
                if have >= length * count:
                    break
        flat = np.concatenate(stream) if stream else np.zeros(0, dtype=np.int64)
        packed = [flat[k * length : (k + 1) * length] for k in range(len(flat) // length)][:count]
        if not packed:
            raise EvalError(
                f"the held-out documents hold {len(flat)} tokens in all, fewer than one sequence of {length}",
                fix="use a larger validation share or shorter lengths",
            )
        return packed, True

    def short_documents(self, length: int, count: int, *, min_tokens: int = 32) -> list[np.ndarray]:
        """Up to `count` held-out documents (of at least `min_tokens`), each cut to `length` tokens."""
        self._require_some()
        out: list[np.ndarray] = []
        for ds, s, n in self._ranges():
            lengths = ds.sequence_lengths
            for i in range(s, n):
                if int(lengths[i]) >= min(min_tokens, length):
                    out.append(np.asarray(ds[i][:length], dtype=np.int64))
                    if len(out) == count:
                        return out
        return out

    def shuffled_documents(self, seed: int, *, eod: int | None = None) -> Iterator[np.ndarray]:
        """Whole held-out documents (end-of-document id included) in a seeded random order, endless:
        each pass over the held-out documents is a new permutation. Documents without a token (besides
        `eod`) are left out; a pass that finds none raises EvalError, so a consumer waiting for tokens
        never waits forever."""
        self._require_some()
        ranges = list(self._ranges())
        sizes = np.cumsum([n - s for _, s, n in ranges])
        rng = np.random.default_rng(seed)
        while True:
            found = 0
            for k in rng.permutation(int(sizes[-1])):
                j = int(np.searchsorted(sizes, k, side="right"))
                ds, start, _ = ranges[j]
                doc = np.asarray(ds[start + int(k) - (int(sizes[j - 1]) if j else 0)], dtype=np.int64)
                if doc.size and (eod is None or bool((doc != eod).any())):
                    found += 1
                    yield doc
            if not found:
                raise self._no_tokens(int(sizes[-1]), eod)

    def _no_tokens(self, documents: int, eod: int | None) -> EvalError:
        names = ", ".join(Path(p).name for p in self.prefixes)
        tokens = sum(
            int(np.asarray(ds.sequence_lengths[s:n], dtype=np.int64).sum()) for ds, s, n in self._ranges()
        )
        what = (
            no_tokens_message(f"{names} (held out)", documents)
            if tokens == 0
            else f"the {documents:,} held-out documents of {names} hold no token besides end-of-document {eod}"
        )
        return EvalError(
            f"{what}: no window can be packed from them",
            where=", ".join(self.prefixes),
            fix="give the stage data documents with tokens in its held-out share, or pass unseen "
            "data with --data",
        )

    def filler_tokens(self, count: int) -> list[int]:
        """Up to `count` held-out tokens back to back (passkey filler), end-of-document ids included."""
        self._require_some()
        out: list[int] = []
        for ds, s, n in self._ranges():
            for i in range(s, n):
                out.extend(int(t) for t in ds[i])
                if len(out) >= count:
                    return out[:count]
        return out


def heldout_for_stage(
    rp: ResolvedPlan, stage: ResolvedStage, prefixes: Sequence[str] | None = None
) -> HeldOut:
    """The held-out part of a stage's data (or `prefixes`, entirely unseen, when given)."""
    if prefixes:
        return HeldOut([str(p) for p in prefixes], None)
    blend = stage_blend(rp, stage)
    split = stage.data.split if stage.data is not None else "99,1,0"
    return HeldOut([e.prefix for e in blend.entries], split)
