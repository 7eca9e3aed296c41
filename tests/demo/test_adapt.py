"""AR → MDM, AR → UDM and MDM → UDM adaptation: the published autoregressive base's weights in a diffusion model of
the diffusion models' unpadded rows — every transformer weight unchanged, the vocabulary rows cut, the
masked model's [MASK] row the mean of the token rows — and the refusals of a source it cannot adapt."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from longctx.checkpoint import adopt
from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.demo.adapt import adapt_to_diffusion
from longctx.demo.published import ARCHIVE, family_dir, read_card
from longctx.errors import CheckpointError
from tests.train.helpers import saved_tensors

CARD = read_card(family_dir("ar"))
PREFIXES = ("decoder", "embedding", "output_layer")


@pytest.fixture(scope="module")
def ar_save(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save = tmp_path_factory.mktemp("ar") / "checkpoints"
    adopt(family_dir("ar") / ARCHIVE, save, mode="link", allow_copy=True)
    return save


def test_the_adapted_model_keeps_every_weight_and_adds_a_mask_row(ar_save: Path, tmp_path: Path) -> None:
    out = tmp_path / "init"
    it = adapt_to_diffusion(ar_save, out, arch=CARD.arch, seq_length=256, input_rows=514, output_rows=513)
    assert it == CARD.iteration
    src = saved_tensors(ar_save / f"iter_{it:07d}", prefixes=PREFIXES)
    dst = saved_tensors(out / f"iter_{it:07d}", prefixes=PREFIXES)
    assert set(src) == set(dst)
    emb, out_w = "embedding.word_embeddings.weight", "output_layer.weight"
    assert src[emb].shape[0] == CARD.padded_vocab_size == 640  # Megatron's padded rows
    assert dst[emb].shape[0] == 514 and dst[out_w].shape[0] == 513
    assert torch.equal(dst[emb][:513], src[emb][:513]) and torch.equal(dst[out_w], src[out_w][:513])
    assert torch.allclose(dst[emb][513], src[emb][:513].mean(0))
    assert all(torch.equal(dst[k], src[k]) for k in src if k not in (emb, out_w))
    fam = inspect_checkpoint(out).family
    assert fam.label == "MDM" and (fam.input_vocab_rows, fam.output_vocab_rows) == (514, 513)


def test_a_source_it_cannot_adapt_is_refused(ar_save: Path, tmp_path: Path) -> None:
    other = CARD.arch.model_copy(update={"num_layers": 3})
    with pytest.raises(CheckpointError, match="shape is not the diffusion recipe's"):
        adapt_to_diffusion(
            ar_save, tmp_path / "a", arch=other, seq_length=256, input_rows=514, output_rows=513
        )
    mdm = tmp_path / "mdm"
    adapt_to_diffusion(ar_save, mdm, arch=CARD.arch, seq_length=256, input_rows=514, output_rows=513)
    with pytest.raises(CheckpointError, match="holds a mdm model, which a mdm model cannot start from"):
        adapt_to_diffusion(
            mdm, tmp_path / "b", arch=CARD.arch, seq_length=256, input_rows=514, output_rows=513
        )
    with pytest.raises(CheckpointError, match="no adaptation to a 'ar' model"):
        adapt_to_diffusion(
            ar_save,
            tmp_path / "c",
            kind="ar",
            arch=CARD.arch,
            seq_length=256,
            input_rows=513,
            output_rows=513,
        )
    assert not any((tmp_path / x).exists() for x in "abc")


def test_the_uniform_state_adaptation_has_no_mask_row(ar_save: Path, tmp_path: Path) -> None:
    out = tmp_path / "udm"
    it = adapt_to_diffusion(
        ar_save, out, kind="udm", arch=CARD.arch, seq_length=256, input_rows=513, output_rows=513
    )
    src = saved_tensors(ar_save / f"iter_{it:07d}", prefixes=PREFIXES)
    dst = saved_tensors(out / f"iter_{it:07d}", prefixes=PREFIXES)
    emb = "embedding.word_embeddings.weight"
    assert dst[emb].shape[0] == 513 and torch.equal(dst[emb], src[emb][:513])
    fam = inspect_checkpoint(out).family
    assert fam.label == "UDM" and fam.objective == "udm" and fam.mask_id is None


def test_a_uniform_state_model_starts_from_a_masked_one(ar_save: Path, tmp_path: Path) -> None:
    """The published UDM's route: the MDM's weights, bidirectional already, less its [MASK] row."""
    mdm, udm = tmp_path / "mdm", tmp_path / "udm"
    it = adapt_to_diffusion(ar_save, mdm, arch=CARD.arch, seq_length=256, input_rows=514, output_rows=513)
    adapt_to_diffusion(mdm, udm, kind="udm", arch=CARD.arch, seq_length=256, input_rows=513, output_rows=513)
    src = saved_tensors(mdm / f"iter_{it:07d}", prefixes=PREFIXES)
    dst = saved_tensors(udm / f"iter_{it:07d}", prefixes=PREFIXES)
    emb = "embedding.word_embeddings.weight"
    assert dst[emb].shape[0] == 513 and torch.equal(dst[emb], src[emb][:513])
    assert all(torch.equal(dst[k], src[k]) for k in src if k != emb)
    fam = inspect_checkpoint(udm).family
    assert fam.label == "UDM" and fam.objective == "udm" and fam.mask_id is None
