"""What megatron-core makes of a `split` ("98,2,0") for one indexed dataset, from its index alone.

megatron-core cuts a dataset's documents into train / valid / test ranges: the split is normalised to
fractions, accumulated into book-ends, and part i holds documents `round(lo·N) … round(hi·N)` of N
(`parse_and_normalize_split`, `convert_split_vector_to_split_matrix` and
`BlendedMegatronDatasetBuilder._build_megatron_dataset_splits`); a part whose share is 0 is not built.
Two start-up failures follow from these numbers and nothing else, so they are caught before a launch:
a part that is built but holds no document (GPTDataset's `_get_num_epochs` then loops forever: an epoch
of 0 tokens never reaches the one token it asks for), and a validation or test part that yields no sample.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np

from longctx.data.indexed import IndexInfo

PART_NAMES = ("train", "valid", "test")


@dataclasses.dataclass(frozen=True)
class SplitPart:
    """One part of one dataset: its share of the documents, which documents, and their tokens."""

    name: str
    share: float  # normalised fraction; 0: megatron-core does not build the part
    first: int  # document range [first, end)
    end: int
    tokens: int

    @property
    def documents(self) -> int:
        return self.end - self.first

    @property
    def built(self) -> bool:
        return self.share > 0

    def samples_in_one_epoch(self, seq_length: int) -> int:
        """Samples of `seq_length` (+1 label token) that one pass over the part's tokens makes."""
        return max(0, (self.tokens - 1) // seq_length)


def split_shares(split: str) -> list[float]:
    """ "98,2,0" → [0.98, 0.02, 0.0], as megatron-core parses it (missing parts are 0)."""
    values = [float(x) for x in re.findall(r"[.0-9]+", split)]
    values += [0.0] * (len(PART_NAMES) - len(values))
    total = sum(values)
    return [v / total for v in values[: len(PART_NAMES)]] if total > 0 else values[: len(PART_NAMES)]


def split_parts(info: IndexInfo, split: str) -> list[SplitPart]:
    """The train, valid and test parts of one dataset under `split`."""
    shares = split_shares(split)
    n = info.documents
    lengths = np.asarray(info.document_lengths(), dtype=np.int64)
    csum = np.concatenate([[0], np.cumsum(lengths)]) if n else np.zeros(1, dtype=np.int64)
    out: list[SplitPart] = []
    lo = 0.0
    for name, share in zip(PART_NAMES, shares, strict=True):
        hi = lo + share
        first, end = (round(lo * n), round(hi * n)) if share > 0 else (0, 0)
        out.append(SplitPart(name, share, first, end, int(csum[end] - csum[first]) if share > 0 else 0))
        lo = hi
    return out


__all__ = ["PART_NAMES", "SplitPart", "split_parts", "split_shares"]
