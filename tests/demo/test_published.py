"""The published demo base in the package: its card pins the archive and the tokenizer, a damaged or
changed file is refused before anything is written, and adopting it gives a model-only torch_dist
checkpoint that the planner and the evaluation read like any user's base."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.save_layout import read_tracker
from longctx.demo.corpus import documents
from longctx.demo.published import (
    ARCHIVE,
    CARD,
    TOKENIZER_DIR,
    Card,
    family_dir,
    install_published,
    read_card,
    verify_published,
)
from longctx.demo.train_base import card_toml
from longctx.errors import CheckpointError, TokenizerError
from longctx.tokenizer import train_sentencepiece
from longctx.util.hashing import md5_file

AR = family_dir("ar")


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    out = tmp_path / "published"
    shutil.copytree(AR, out)
    return out


def _targets(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "run" / "tokenizer", tmp_path / "run" / "base" / "checkpoints"


def test_the_package_holds_a_small_pinned_base() -> None:
    card = verify_published(AR)
    assert card.family == "ar" and card.archive_md5 == md5_file(AR / ARCHIVE)
    assert (AR / ARCHIVE).stat().st_size <= 8 * 2**20  # the budget for a model in git
    assert card.seq_length == 256 and card.arch.num_layers == 2
    at_window = [r for r in card.retrieval if r.length == card.seq_length]
    assert at_window and at_window[0].keys >= 100  # 20 keys per depth, five depths
    assert "longctx demo --train-base" in (AR / "MODEL_CARD.md").read_text()


def test_card_toml_round_trips() -> None:
    card = read_card(AR)
    assert Card.model_validate(tomllib.loads(card_toml(card))) == card


def test_card_toml_escapes_control_characters_quotes_and_newlines() -> None:
    card = read_card(AR).model_copy(update={"machine": 'a "b"\\c\nd\x00\x1b\x7f', "command": "x\r\n'''y"})
    text = card_toml(card)
    assert text.startswith("# The published demo base")
    assert Card.model_validate(tomllib.loads(text)) == card


def test_install_adopts_a_model_only_checkpoint_then_keeps_it(tmp_path: Path) -> None:
    tok, save = _targets(tmp_path)
    card, wrote = install_published(AR, tok, save)
    assert wrote and read_tracker(save).iteration == card.iteration
    rep = inspect_checkpoint(save)
    assert rep.contents == "model" and rep.optimizer is None  # what Ermine's *_model_only.tar holds
    assert (tok / "manifest.toml").read_text() == (AR / "tokenizer.toml").read_text()
    _, again = install_published(AR, tok, save)
    assert not again  # a rerun resumes: nothing is written twice


def test_a_changed_archive_is_refused_before_anything_is_written(copy: Path, tmp_path: Path) -> None:
    data = bytearray((copy / ARCHIVE).read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / ARCHIVE).write_bytes(bytes(data))
    tok, save = _targets(tmp_path)
    with pytest.raises(CheckpointError, match="md5") as err:
        install_published(copy, tok, save)
    assert "restore" in (err.value.fix or "")
    assert not tok.exists() and not save.exists()


def test_a_changed_tokenizer_is_refused(copy: Path, tmp_path: Path) -> None:
    other = train_sentencepiece(
        list(documents(40, seed=5, min_words=50, max_words=200)), tmp_path / "other", 400
    )
    shutil.copyfile(other, copy / TOKENIZER_DIR / "tokenizer.model")  # a valid model, another vocabulary
    tok, save = _targets(tmp_path)
    with pytest.raises(TokenizerError, match="does not match its manifest"):
        install_published(copy, tok, save)
    assert not tok.exists() and not save.exists()
    (copy / TOKENIZER_DIR / "tokenizer.model").write_bytes(b"damaged")
    with pytest.raises(TokenizerError, match=r"tokenizer\.model"):
        install_published(copy, tok, save)


def test_a_card_that_pins_another_tokenizer_is_refused(copy: Path, tmp_path: Path) -> None:
    text = (copy / CARD).read_text()
    (copy / CARD).write_text(
        re.sub(r'tokenizer_md5 = "[0-9a-f]+"', 'tokenizer_md5 = "' + "0" * 32 + '"', text)
    )
    with pytest.raises(TokenizerError, match="pins md5"):
        install_published(copy, *_targets(tmp_path))


def test_a_missing_or_broken_card_is_named(copy: Path) -> None:
    (copy / CARD).write_text("name = \n")
    with pytest.raises(CheckpointError, match="card cannot be read"):
        verify_published(copy)
    (copy / CARD).unlink()
    with pytest.raises(CheckpointError, match="missing") as err:
        verify_published(copy)
    assert "--train-base" in (err.value.fix or "")


def test_a_damaged_archive_with_a_matching_card_is_refused_by_adopt(copy: Path, tmp_path: Path) -> None:
    # a truncated tar whose card was rewritten to match: ckpt adopt's own checks refuse it
    archive = copy / ARCHIVE
    archive.write_bytes(archive.read_bytes()[: archive.stat().st_size // 3])
    text = (copy / CARD).read_text()
    (copy / CARD).write_text(
        re.sub(r'archive_md5 = "[0-9a-f]+"', f'archive_md5 = "{md5_file(archive)}"', text)
    )
    tok, save = _targets(tmp_path)
    with pytest.raises(CheckpointError):
        install_published(copy, tok, save)
    assert not save.exists() or read_tracker(save) is None


ABSOLUTE_PATH = re.compile(r"""(?:^|[\s"'`(=])/[\w.-]+/""")


@pytest.mark.parametrize("family", ["ar", "mdm"])
def test_published_files_name_no_build_directory(family: str) -> None:
    # the card and manifest travel with the package: nothing in them may point at where they were built
    for name in (CARD, "tokenizer.toml", "MODEL_CARD.md"):
        text = (family_dir(family) / name).read_text()
        assert ABSOLUTE_PATH.search(text) is None and "runs/" not in text, (name, ABSOLUTE_PATH.search(text))
    assert ABSOLUTE_PATH.search('description = "fingerprint of /home/u/x/tokenizer"')  # the check can fail


def test_the_package_holds_a_pinned_mdm_in_the_ermine_predecessor_layout() -> None:
    """The masked-diffusion base: pinned as the autoregressive one is, stored as Ermine's predecessor
    stores its MDMs (layers under `encoder.`, the `subtokenizer.*` buffers, a [MASK] input row), and
    infilling its key inside its window."""
    mdm = family_dir("mdm")
    card = verify_published(mdm)
    assert card.family == "mdm" and (mdm / ARCHIVE).stat().st_size <= 8 * 2**20
    fam = inspect_checkpoint(mdm / ARCHIVE).family
    assert fam.label == "MDM" and fam.block == "encoder" and fam.mask_id == card.mask_id
    assert (fam.input_vocab_rows, fam.output_vocab_rows) == (card.padded_vocab_size, card.output_vocab_size)
    at_window = [r for r in card.retrieval if r.length == card.seq_length]
    assert at_window and at_window[0].keys >= 100
    assert "longctx demo --train-base --family mdm" in (mdm / "MODEL_CARD.md").read_text()
    assert card.adapted_from == read_card(AR).name and card.tokenizer_md5 == read_card(AR).tokenizer_md5
    assert Card.model_validate(tomllib.loads(card_toml(card))) == card


def _repin(copy: Path, key: str, value: str, name: str = CARD) -> None:
    text = (copy / name).read_text()
    (copy / name).write_text(re.sub(rf'^{key} = "[0-9a-f]+"', f'{key} = "{value}"', text, flags=re.M))


def test_a_foreign_archive_with_a_repinned_md5_is_refused(copy: Path, tmp_path: Path) -> None:
    """The card's claims are compared with the archive itself: the published MDM's archive under the AR
    card, its md5 re-pinned, is another model (family, vocabulary rows, [MASK])."""
    shutil.copyfile(family_dir("mdm") / ARCHIVE, copy / ARCHIVE)
    _repin(copy, "archive_md5", md5_file(copy / ARCHIVE))
    tok, save = _targets(tmp_path)
    with pytest.raises(CheckpointError, match="not the model its card describes") as err:
        install_published(copy, tok, save)
    assert "family: the card says 'ar', the archive 'mdm'" in err.value.what
    assert "padded_vocab_size: the card says 640, the archive 514" in err.value.what
    assert not tok.exists() and not save.exists()


@pytest.mark.parametrize(
    ("field", "value"), [("iteration", "4000"), ("seq_length", "512"), ("rotary_base", "500000")]
)
def test_a_card_claiming_another_training_is_refused(copy: Path, field: str, value: str) -> None:
    text = (copy / CARD).read_text()
    (copy / CARD).write_text(re.sub(rf"^{field} = \d+", f"{field} = {value}", text, flags=re.M))
    with pytest.raises(CheckpointError, match=rf"{field}: the card says {value}, the archive"):
        verify_published(copy)


def test_a_swapped_tokenizer_model_with_repinned_md5s_is_refused(copy: Path, tmp_path: Path) -> None:
    """tokenizer.json decides the encoding fingerprint and tokenizer.model the md5: another model with the
    md5 re-pinned in manifest and card matches both pins, and is refused because the two files disagree."""
    other = train_sentencepiece(
        list(documents(40, seed=5, min_words=50, max_words=200)), tmp_path / "other", 512
    )
    shutil.copyfile(other, copy / TOKENIZER_DIR / "tokenizer.model")
    md5 = md5_file(copy / TOKENIZER_DIR / "tokenizer.model")
    _repin(copy, "tokenizer_md5", md5)
    _repin(copy, "md5", md5, name="tokenizer.toml")
    tok, save = _targets(tmp_path)
    with pytest.raises(
        TokenizerError, match=r"tokenizer\.json and tokenizer\.model encode sample 0 differently"
    ):
        install_published(copy, tok, save)
    assert not tok.exists() and not save.exists()


def test_a_run_directory_of_another_base_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """A rerun keeps what is installed; another base's or tokenizer's files there are not "already done"."""
    tok, save = _targets(tmp_path)
    install_published(AR, tok, save)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    with pytest.raises(CheckpointError, match="the run directory's base is not longctx-demo-mdm-base") as err:
        install_published(family_dir("mdm"), tok, save)
    assert "family: the card says 'mdm', the archive 'ar'" in err.value.what and "new --dir" in (
        err.value.fix or ""
    )
    (tok / "tokenizer.model").write_bytes((tok / "tokenizer.model").read_bytes() + b"\n")
    with pytest.raises(TokenizerError, match="the run directory's tokenizer is not longctx-demo-ar-base's"):
        install_published(AR, tok, save)
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*")}
    assert set(after) == set(before)


def test_demo_on_a_run_directory_of_another_tokenizer_writes_nothing(tmp_path: Path) -> None:
    """`longctx demo --dir` on another run's directory is refused at its first step, before any data."""
    from tests.bad_input.harness import refused

    run = tmp_path / "run"
    install_published(AR, run / "tokenizer", run / "base" / "checkpoints")
    with (run / "tokenizer" / "manifest.toml").open("a") as fh:
        fh.write("# another run's manifest\n")
    refused(
        ["demo", "--dir", run], [run], needle="the run directory's tokenizer is not longctx-demo-ar-base's"
    )
    assert not (run / "data").exists()
