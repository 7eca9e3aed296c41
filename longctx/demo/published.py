"""The published demo base: a model-only torch_dist archive, its tokenizer and a card, in the package.

    longctx/resources/demo/<family>/
        base_model_only.tar   the save dir (iter_N + tracker), as Ermine ships its `*_model_only.tar`
        tokenizer/            SentencePiece model, HF files and tokenizer.json (no manifest inside)
        tokenizer.toml        the tokenizer's manifest: md5, vocabulary, special ids, encoding
        card.toml             what the base is (shape, training, figures) and the md5 of the archive
        MODEL_CARD.md         the same for people

The demo adopts it as a user adopts a downloaded base: `verify_published` checks the archive against
the card's md5 and the tokenizer against its manifest before anything is written, then
`install_published` copies the tokenizer and adopts the archive (`ckpt adopt`'s checks included).
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from longctx.arch import ModelArch
from longctx.checkpoint import adopt, inspect_checkpoint
from longctx.checkpoint.save_layout import TRACKER
from longctx.errors import CheckpointError, TokenizerError
from longctx.tokenizer import load_manifest, verify_tokenizer
from longctx.util.confined_read import read_text
from longctx.util.hashing import md5_file
from longctx.util.shipped import resource_dir

RESOURCES = resource_dir("demo")
ARCHIVE = "base_model_only.tar"
CARD = "card.toml"
TOKENIZER_DIR = "tokenizer"
TOKENIZER_MANIFEST = "tokenizer.toml"


class Retrieval(BaseModel):
    """Greedy exact match of the whole key, per needle task and length, over every depth (the card's
    figures)."""

    model_config = ConfigDict(extra="forbid")
    task: str = "single"  # the needle task (`longctx.plan.eval_tasks`)
    length: int
    keys: int  # per length, all depths together
    exact: float  # fraction in [0, 1]


class Card(BaseModel):
    """card.toml: the published base, with the md5s that pin it."""

    model_config = ConfigDict(extra="forbid")
    name: str
    family: str  # "ar", "mdm", "udm"
    archive: str = ARCHIVE
    archive_md5: str
    tokenizer_md5: str  # tokenizer.model, as in the manifest
    iteration: int
    seq_length: int
    rotary_base: int
    padded_vocab_size: int  # input-embedding rows
    output_vocab_size: int | None = None  # output-layer rows, where not the same (the MDM: no [MASK] logit)
    mask_id: int | None = None  # the MDM's [MASK] id
    arch: ModelArch
    tokens: int  # trained on
    wall_seconds: float
    machine: str
    command: str  # how it is rebuilt
    adapted_from: str | None = None  # the published base whose weights and tokenizer it started from
    retrieval: list[Retrieval] = []


def family_dir(family: str) -> Path:
    return RESOURCES / family


CARD_BYTES = 1 << 20  # a card is ~2 KiB


def read_card(directory: Path) -> Card:
    """The card of the published base in `directory`, read as a bounded regular file inside it (a card that
    is a link to /dev/zero, a FIFO or a huge file is refused, not read)."""
    path = directory / CARD
    text = read_text(
        path,
        directory,
        "published base's card",
        error=CheckpointError,
        max_bytes=CARD_BYTES,
        place=f"the published base's directory {directory}",
    )
    if text is None:
        raise CheckpointError(
            f"no published base in {directory} ({CARD} is missing)",
            where=str(path),
            fix="rebuild it with `longctx demo --train-base`, or restore the file from git",
        )
    try:
        return Card.model_validate(tomllib.loads(text))
    except (tomllib.TOMLDecodeError, ValidationError, RecursionError) as err:
        raise CheckpointError(
            f"the published base's card cannot be read: {str(err).splitlines()[0]}",
            where=str(path),
            fix="restore the file from git, or rebuild the base with `longctx demo --train-base`",
        ) from None


# the card's architecture fields that the archive's shapes and saved args decide
_ARCH_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "kv_channels", "normalization", "swiglu", "qk_layernorm",
                "untie_embeddings_and_output_weights")  # fmt: skip


def card_differences(card: Card, archive: Path) -> list[str]:
    """What the card says about the model that its archive contradicts (read from the archive's metadata
    and saved args, no tensor read): iteration, length, RoPE base, family, vocabulary rows, architecture."""
    report = inspect_checkpoint(archive)
    fam = report.family
    found: dict[str, object] = {
        "iteration": report.iteration,
        "seq_length": report.saved_args.get("seq_length"),
        "rotary_base": report.saved_args.get("rotary_base"),
        # a uniform-state model's objective is not in its weights: its layout says UDM, the plan the rest
        "family": fam.objective or ("udm" if fam.family == "UDM" else None),
        "padded_vocab_size": fam.input_vocab_rows,
        "output_vocab_size": fam.output_vocab_rows,
        "mask_id": fam.mask_id,
        **{f"arch.{k}": getattr(report.arch, k) for k in _ARCH_FIELDS},
    }
    claimed: dict[str, object] = {
        "iteration": card.iteration,
        "seq_length": card.seq_length,
        "rotary_base": card.rotary_base,
        "family": card.family,
        "padded_vocab_size": card.padded_vocab_size,
        "output_vocab_size": card.output_vocab_size or card.padded_vocab_size,
        "mask_id": card.mask_id,
        **{f"arch.{k}": getattr(card.arch, k) for k in _ARCH_FIELDS},
    }
    return [
        f"{k}: the card says {claimed[k]!r}, the archive {found[k]!r}"
        for k in claimed
        if claimed[k] != found[k]
    ]


def verify_published(directory: Path) -> Card:
    """The card, once the archive's md5 and the tokenizer (files and manifest) match it; else an error
    naming the file. Reads only."""
    card = read_card(directory)
    archive = directory / card.archive
    if not archive.is_file():
        raise CheckpointError(
            f"the published base's archive is missing: {archive}",
            where=str(archive),
            fix="restore it from git, or rebuild the base with `longctx demo --train-base`",
        )
    got = md5_file(archive)
    if got != card.archive_md5:
        raise CheckpointError(
            f"the published base's archive has md5 {got}, its card says {card.archive_md5}",
            where=str(archive),
            fix="restore the archive from git (a changed base needs a new card: `longctx demo --train-base`)",
        )
    differences = card_differences(card, archive)
    if differences:
        raise CheckpointError(
            f"the published base's archive is not the model its card describes: {'; '.join(differences[:4])}"
            + (f" (and {len(differences) - 4} more)" if len(differences) > 4 else ""),
            where=str(archive),
            fix="restore the archive and card.toml from git, or rebuild both with `longctx demo --train-base`",
        )
    manifest = load_manifest(directory / TOKENIZER_MANIFEST)
    if manifest.md5 != card.tokenizer_md5:
        raise TokenizerError(
            f"the tokenizer manifest pins md5 {manifest.md5}, the card {card.tokenizer_md5}",
            where=str(directory / TOKENIZER_MANIFEST),
            fix="restore both files from git",
        )
    report = verify_tokenizer(directory / TOKENIZER_DIR, manifest)
    if not report.ok:
        first = report.findings.errors[0] if report.findings.errors else None
        raise TokenizerError(
            "the published tokenizer does not match its manifest"
            + (f": {first.message}" if first is not None else ""),
            where=str(directory / TOKENIZER_DIR),
            fix="restore the tokenizer directory from git",
        )
    return card


def _refuse_other_targets(directory: Path, card: Card, tokenizer_dir: Path, save_dir: Path) -> None:
    """A rerun keeps what an earlier run installed; what is there must then be this base's, or the run
    directory belongs to another run (another tokenizer, another base) and nothing is written into it."""
    fix = "give the demo a new --dir (this one holds another run), or remove it"
    manifest = tokenizer_dir / "manifest.toml"
    if manifest.is_file():
        model = tokenizer_dir / "tokenizer.model"
        same = manifest.read_bytes() == (directory / TOKENIZER_MANIFEST).read_bytes() and (
            model.is_file() and md5_file(model) == card.tokenizer_md5
        )
        if not same:
            raise TokenizerError(
                f"the run directory's tokenizer is not {card.name}'s (its manifest or tokenizer.model differ)",
                where=str(tokenizer_dir),
                fix=fix,
            )
    if (save_dir / TRACKER).is_file():
        try:
            differences = card_differences(card, save_dir)
        except CheckpointError as err:
            differences = [err.what]
        if differences:
            raise CheckpointError(
                f"the run directory's base is not {card.name}: {'; '.join(differences[:3])}",
                where=str(save_dir),
                fix=fix,
            )


def install_published(directory: Path, tokenizer_dir: Path, save_dir: Path) -> tuple[Card, bool]:
    """Verify the published base, copy its tokenizer to `tokenizer_dir` (with the manifest as
    manifest.toml) and adopt its archive into `save_dir`; (card, whether anything was written). A
    target that exists is kept (a rerun resumes), so the verification is what protects it."""
    card = verify_published(directory)
    _refuse_other_targets(directory, card, tokenizer_dir, save_dir)
    wrote = False
    if not (tokenizer_dir / "manifest.toml").is_file():
        staging = tokenizer_dir.with_name(tokenizer_dir.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(directory / TOKENIZER_DIR, staging)
        shutil.copyfile(directory / TOKENIZER_MANIFEST, staging / "manifest.toml")
        staging.rename(tokenizer_dir)
        wrote = True
    if not (save_dir / TRACKER).is_file():
        adopt(directory / card.archive, save_dir, mode="link", allow_copy=True)
        wrote = True
    return card, wrote
