"""What each Megatron-LM release adds, removes or redefines, in one table.

The argv builder, the RoPE flag mapping, the tokenizer's encoding spec and the checkpoint readers ask
`facts(version)` instead of comparing versions themselves, so supporting a new release is one `Release`
row. Each row lists only what changes at that release; `facts` folds the rows up to a version. It sits
at the top of the package, not in stage/, because rope/, tokenizer/ and checkpoint/ consult it and stage/
imports them.

Where the facts come from: 0.16.1 and 0.19.0 are read from their sources (`megatron/training/arguments.py`,
`megatron/training/argument_utils.py`, `gpt_builders.py`, `megatron/core/tokenizers`,
`megatron/core/dist_checkpointing`; tests/stage/test_versions_source.py re-reads them). The 0.17 and 0.18
rows (HF tokenizer defaults flipped and `--legacy-tokenizer` removed in 0.17, the `--tokenizer-hf-*`
switches removed in 0.18) come from the release notes; the `--tokenizer-hf-no-*` switches are entered at
0.19, the first source they were read in, so a plan on 0.17/0.18 that needs them is refused rather than
guessed. Flags older than 0.8 are not tracked (the table starts there).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Literal

from longctx.errors import StageError

Version = tuple[int, int, int]
CommonStateEra = Literal["common.pt", "dcp"]
# What pretrain_gpt.py does with packed documents (attention within documents):
#   "none": no pretraining batch carries document boundaries (only --sft datasets produce cu_seqlens);
#   "cp1":  --dataloader-inter-document-masking gives cu_seqlens and restarts positions at every document,
#           right at CP 1 only (see packed_documents)
PackedDocuments = Literal["none", "cp1"]
# encoding options of Megatron's HuggingFaceTokenizer (megatron.core.tokenizers)
HfOption = Literal["use_fast", "include_special_tokens"]


@dataclasses.dataclass(frozen=True)
class Release:
    """What changes at one release (None: unchanged from the release before)."""

    version: Version
    adds: frozenset[str] = frozenset()
    removes: frozenset[str] = frozenset()
    # HuggingFaceTokenizer's defaults (use_fast, include_special_tokens) from this release
    hf_defaults: Mapping[HfOption, bool] | None = None
    # the flag that sets each option to the opposite of its default ({}: none can)
    hf_switches: Mapping[HfOption, str] | None = None
    # where a torch_dist save keeps its common state
    common_state: CommonStateEra | None = None
    # flags whose value reaches a GPT model built by pretrain_gpt.py from this release
    gpt_honours: frozenset[str] = frozenset()
    # attention within packed documents (PackedDocuments)
    packed_documents: PackedDocuments | None = None
    notes: tuple[str, ...] = ()


YARN_FLAGS: tuple[str, ...] = (
    "--rotary-scaling-factor",
    "--yarn-original-max-position-embeddings",
    "--yarn-beta-fast",
    "--yarn-beta-slow",
    "--mscale",
    "--mscale-all-dim",
)
PI_FLAG = "--rotary-seq-len-interpolation-factor"
LEGACY_TOKENIZER_FLAG = "--legacy-tokenizer"

RELEASES: tuple[Release, ...] = (
    Release(
        (0, 8, 0),
        adds=frozenset({"--no-create-attention-mask-in-dataloader"}),
        hf_defaults={"use_fast": False, "include_special_tokens": False},
        hf_switches={
            "use_fast": "--tokenizer-hf-use-fast",
            "include_special_tokens": "--tokenizer-hf-include-special-tokens",
        },
        common_state="common.pt",
        packed_documents="none",
        notes=("the first release this table covers",),
    ),
    Release((0, 10, 0), adds=frozenset({"--cp-comm-type"})),
    Release(
        (0, 16, 0),
        adds=frozenset(
            {"--exit-signal", "--dataloader-fast-cache-load", "--dataloader-defer-npy-index-mmap"}
        ),
    ),
    Release(
        (0, 17, 0),
        removes=frozenset({LEGACY_TOKENIZER_FLAG}),
        hf_defaults={"use_fast": True, "include_special_tokens": True},
        # the 0.16 switches only set what is now the default
        hf_switches={},
        notes=(
            "HuggingFaceTokenizer encodes with the fast tokenizer and adds its special tokens by default",
        ),
    ),
    Release(
        (0, 18, 0),
        removes=frozenset({"--tokenizer-hf-use-fast", "--tokenizer-hf-include-special-tokens"}),
    ),
    Release(
        (0, 19, 0),
        adds=frozenset(
            {
                "--override-ckpt-iteration",
                "--dataloader-inter-document-masking",
                "--yarn-original-max-position-embeddings",
                "--yarn-beta-fast",
                "--yarn-beta-slow",
                "--yarn-correction-range-round-to-int",
                "--tokenizer-hf-no-use-fast",
                "--tokenizer-hf-no-include-special-tokens",
            }
        ),
        hf_switches={
            "use_fast": "--tokenizer-hf-no-use-fast",
            "include_special_tokens": "--tokenizer-hf-no-include-special-tokens",
        },
        common_state="dcp",
        packed_documents="cp1",
        # --position-embedding-type yarn and these reach GPTModel (argument_utils maps the unprefixed
        # --rotary-scaling-factor/--mscale/--mscale-all-dim to config.yarn_*; gpt_config_from_args passes
        # the interpolation factor); before, only MLA read them
        gpt_honours=frozenset({*YARN_FLAGS, PI_FLAG}),
        notes=("torch_dist saves keep their common state as the DCP object common_state/shard_0_1",),
    ),
)


@dataclasses.dataclass(frozen=True)
class MegatronFacts:
    """The table folded up to one version."""

    version: Version
    hf_defaults: Mapping[HfOption, bool]
    hf_switches: Mapping[HfOption, str]
    common_state: CommonStateEra
    gpt_honours: frozenset[str]
    packed_documents: PackedDocuments

    @property
    def label(self) -> str:
        return ".".join(map(str, self.version))

    def has_flag(self, flag: str) -> bool | None:
        """True/False for flags the table tracks (added or removed by some release), None otherwise."""
        added, removed = first_version(flag), removed_version(flag)
        if added is None and removed is None:
            return None
        return (added is None or self.version >= added) and (removed is None or self.version < removed)

    @property
    def cli_yarn(self) -> bool:
        return all(f in self.gpt_honours for f in YARN_FLAGS)

    @property
    def cli_pi(self) -> bool:
        return PI_FLAG in self.gpt_honours

    @property
    def legacy_tokenizer(self) -> bool:
        return bool(self.has_flag(LEGACY_TOKENIZER_FLAG))


def parse_version(text: str | Version) -> Version:
    """'0.16.1', 'v0.19.0rc1', '0.20.0.dev0' → (major, minor, patch)."""
    if isinstance(text, tuple):
        return text
    m = re.match(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if not m:
        raise StageError(
            f"cannot read a Megatron-LM version from {text!r}",
            where="[megatron].version",
            fix="write the megatron-core version of the checkout, like 0.16.1 (megatron/core/package_info.py)",
        )
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def first_version(flag: str) -> Version | None:
    """The release that added `flag` (None: not tracked, or older than the table)."""
    return next((r.version for r in RELEASES if flag in r.adds), None)


def removed_version(flag: str) -> Version | None:
    return next((r.version for r in RELEASES if flag in r.removes), None)


def facts(version: str | Version) -> MegatronFacts:
    v = parse_version(version)
    if v < RELEASES[0].version:
        raise StageError(
            f"Megatron-LM {'.'.join(map(str, v))} is older than any release longctx knows "
            f"({'.'.join(map(str, RELEASES[0].version))})",
            where="[megatron].version",
            fix="use a newer Megatron-LM, or correct [megatron].version",
        )
    hf_defaults: Mapping[HfOption, bool] = {}
    hf_switches: Mapping[HfOption, str] = {}
    era: CommonStateEra = "common.pt"
    honours: frozenset[str] = frozenset()
    documents: PackedDocuments = "none"
    for r in RELEASES:
        if r.version > v:
            break
        hf_defaults = r.hf_defaults if r.hf_defaults is not None else hf_defaults
        hf_switches = r.hf_switches if r.hf_switches is not None else hf_switches
        era = r.common_state or era
        honours = honours | r.gpt_honours
        documents = r.packed_documents or documents
    return MegatronFacts(v, dict(hf_defaults), dict(hf_switches), era, honours, documents)


@dataclasses.dataclass(frozen=True)
class DocumentsVerdict:
    """Whether a Megatron-LM release trains a stage packed by document as the plan says (`ok`), and why."""

    ok: bool
    what: str
    fix: str | None = None


def packed_documents(version: str | Version, cp: int, reset_position_ids: bool) -> DocumentsVerdict:
    """What Megatron-LM at `version` does with a stage packed by document (attention within documents) at
    context parallelism `cp`, read from the sources of 0.16.1 and 0.19.0.

    0.19's `--dataloader-inter-document-masking` gives each batch the document boundaries (cu_seqlens) and
    the THD attention path, which restarts positions at every document. Under CP > 1 its batch split
    (`get_batch_on_this_cp_rank(use_per_sequence_balancing=True)`) cuts each packed row as a whole into
    2·CP chunks and leaves cu_seqlens describing the whole row, while TransformerEngine's THD attention
    under CP takes each rank's tokens as per-document chunks: attention and RoPE would pair other tokens
    than the plan's documents (upstream: NVIDIA/Megatron-LM issue 6156, "Support CP > 1 with
    inter-document masking in pretraining", open). So only CP 1 trains what the plan says.
    """
    f = facts(version)
    label = f.label
    local = "run the stage on the local backend (its document-balanced CP split trains it at any CP)"
    if f.packed_documents == "none":
        return DocumentsVerdict(
            False,
            f"Megatron-LM {label} cannot mask attention between packed documents: its pretraining batches carry "
            "no document boundaries (only --sft datasets produce cu_seqlens) and --reset-attention-mask only "
            "edits a dense mask that TransformerEngine ignores for causal attention",
            f'{local}, use Megatron-LM >= 0.19 ([megatron].version), or set packing = "concat"',
        )
    if cp > 1:
        return DocumentsVerdict(
            False,
            f"Megatron-LM {label} masks documents (--dataloader-inter-document-masking) correctly at CP 1 only: "
            f"at CP {cp} it cuts each packed row as a whole into {2 * cp} chunks, while its THD attention under "
            "CP reads each rank's tokens as per-document chunks, so attention and RoPE would pair other "
            "tokens than the plan's documents (NVIDIA/Megatron-LM issue 6156, open)",
            f'{local}, set cp = 1 for this stage on Megatron-LM, or set packing = "concat"',
        )
    if not reset_position_ids:
        return DocumentsVerdict(
            False,
            f"Megatron-LM {label} restarts the positions at every document under --dataloader-inter-document-"
            "masking: it cannot keep them across documents (reset_position_ids = false)",
            "set reset_position_ids = true for this stage (what Megatron-LM does), or run it on the local "
            "backend, which keeps positions across documents when asked",
        )
    return DocumentsVerdict(
        True,
        f"Megatron-LM {label} masks attention within documents (--dataloader-inter-document-masking, THD) "
        "and restarts positions at every document",
    )


def common_state_releases() -> dict[CommonStateEra, str]:
    """Each common-state era as the releases that save it: {"common.pt": "<=0.18", "dcp": ">=0.19"}."""
    out: dict[CommonStateEra, str] = {}
    eras = [(r.version, r.common_state) for r in RELEASES if r.common_state is not None]
    for i, (v, era) in enumerate(eras):
        if i + 1 < len(eras):
            nxt = eras[i + 1][0]
            last = next(r.version for r in reversed(RELEASES) if r.version < nxt)
            out[era] = f"<={last[0]}.{last[1]}"
        else:
            out[era] = f">={v[0]}.{v[1]}"
    return out


__all__ = [
    "RELEASES",
    "DocumentsVerdict",
    "MegatronFacts",
    "Release",
    "common_state_releases",
    "facts",
    "first_version",
    "packed_documents",
    "parse_version",
    "removed_version",
]
