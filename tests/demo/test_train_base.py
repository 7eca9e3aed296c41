"""`longctx demo --train-base` on a tiny recipe: the published layout it writes is what the demo adopts,
and a second run with more iterations resumes from the last save instead of starting over."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.save_layout import read_tracker
from longctx.demo.published import install_published, verify_published
from longctx.demo.train_base import RECIPES, BaseRecipe, recipe_for, train_base
from longctx.errors import StageError
from tests.train.helpers import saved_tensors


def _tiny(recipe: BaseRecipe, *iterations: int, lengths: tuple[int, ...] = (256,)) -> BaseRecipe:
    """`recipe` on 60-document corpora, its phases cut to `iterations` (four iterations retrieve
    nothing: the bar is off for these tests of the layout; the PUBLISHED bases keep 0.9), each launch
    one trainer process (how a base is run, not what it is: the recipe record and the archive are the
    same, and a worker less is one import of torch and megatron-core less per launch), measured at
    `lengths` — by default the window alone, where the bar is read: the haystacks of 1,024 and 4,096
    tokens beyond it cost most of a build, and only the test of the card's grid reads them."""
    phases = tuple(
        dataclasses.replace(p, docs=60, iterations=n) for p, n in zip(recipe.phases, iterations, strict=True)
    )
    return dataclasses.replace(
        recipe,
        phases=phases,
        heldout_docs=40,
        save_interval=2,
        global_batch=4,
        warmup=1,
        eval_keys=1,
        publish_bar=0.0,
        processes=1,
        eval_lengths=lengths,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
def test_train_base_publishes_then_resumes(tmp_path: Path) -> None:
    recipe = _tiny(RECIPES["ar"], 2, 2, lengths=RECIPES["ar"].eval_lengths)
    assert [p.name for p in recipe.phases] == ["copy", "lookup"]
    work, out = tmp_path / "work", tmp_path / "published"
    lines: list[str] = []
    card = train_base(work, out, recipe=recipe, echo=lines.append)
    # the archive is the last phase's save; the card counts the tokens of both phases
    assert card.iteration == 2 and card.tokens == 4 * 4 * 256 and card.wall_seconds > 0
    assert [(r.task, r.length) for r in card.retrieval] == [
        (t, n) for n in (256, 1024, 4096) for t in ("single", "multikey-2", "multikey-4")
    ]
    assert all(r.keys == 5 for r in card.retrieval)  # one key at each of five depths
    assert verify_published(out) == card
    assert "lookup: 2 iterations on 1 to 4 named keys per document" in (out / "MODEL_CARD.md").read_text()
    # the lookup phase started from the copy phase's weights
    spec = json.loads((work / "lookup" / "train_spec.json").read_text())
    assert spec["pretrained"] == str(work / "copy" / "checkpoints")
    lookup_docs = (work / "lookup" / "corpus" / "train.jsonl").read_text()
    assert max(doc.count("the pass key of") for doc in lookup_docs.splitlines()) > 2
    tok, save = tmp_path / "run" / "tokenizer", tmp_path / "run" / "base" / "checkpoints"
    install_published(out, tok, save)
    assert read_tracker(save).iteration == 2
    # nothing of the build's directories travels in the published archive
    assert inspect_checkpoint(save).args["tokenizer_model"] == "tokenizer"
    assert str(tmp_path).encode() not in (save / "iter_0000002" / "common.pt").read_bytes()

    more = _tiny(RECIPES["ar"], 2, 4)  # measured at the window alone: this card is read for its training
    again = train_base(work, out, recipe=more, echo=lines.append)
    assert again.iteration == 4 and again.wall_seconds > card.wall_seconds  # the launches add up
    metrics = [json.loads(x) for x in (work / "lookup" / "metrics.jsonl").read_text().splitlines()]
    assert [m["iteration"] for m in metrics] == [1, 2, 3, 4]  # resumed at 2, not restarted
    assert any("(kept)" in line for line in lines)  # the tokenizer, the data and the copy phase were kept


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
def test_mdm_base_is_published_in_the_ermine_predecessor_layout(tmp_path: Path) -> None:
    """The masked-diffusion recipe trains under the MDM objective and publishes the model as Ermine's
    predecessor stores its MDMs; the archive reads back as an MDM and adopts as any user's would."""
    recipe = _tiny(RECIPES["mdm"], 2, 2)
    assert [p.name for p in recipe.phases] == ["lookup", "anneal"]
    out = tmp_path / "published"
    card = train_base(tmp_path / "work", out, recipe=recipe, echo=[].append)
    assert card.family == "mdm" and card.mask_id == 513 and card.output_vocab_size == 513
    assert (
        card.command == "longctx demo --train-base --family mdm"
        and card.adapted_from == "longctx-demo-ar-base"
    )
    spec = json.loads((tmp_path / "work" / recipe.phases[-1].name / "train_spec.json").read_text())
    assert spec["objective"]["kind"] == "mdm" and spec["objective"]["mask_id"] == 513
    # the anneal phase decays the rate from the lookup phase's weights; the lookup phase holds it
    assert spec["pretrained"] == str(tmp_path / "work" / "lookup" / "checkpoints")
    assert (spec["lr"]["decay_style"], spec["lr"]["min_lr"]) == ("cosine", pytest.approx(recipe.lr / 10))
    first = json.loads((tmp_path / "work" / "lookup" / "train_spec.json").read_text())
    assert first["lr"]["decay_style"] == "constant"
    assert "the rate decaying to a tenth" in (out / "MODEL_CARD.md").read_text()

    report = inspect_checkpoint(out / "base_model_only.tar")
    fam = report.family
    assert fam.label == "MDM" and fam.block == "encoder" and fam.mask_id == 513
    assert (fam.input_vocab_rows, fam.output_vocab_rows) == (514, 513)
    assert fam.diffusion_args["subtokenizer_type"] == "mask" and fam.diffusion_args["target_length"] == 1
    assert "MDM" in (out / "MODEL_CARD.md").read_text() and "infilling" in (out / "MODEL_CARD.md").read_text()

    save = tmp_path / "run" / "base" / "checkpoints"
    install_published(out, tmp_path / "run" / "tokenizer", save)
    buffers = saved_tensors(save / "iter_0000002", prefixes=("subtokenizer.",))
    assert buffers["subtokenizer.mask"].tolist() == [513]
    assert buffers["subtokenizer.lookup_table"].shape == (513, 1)
    assert buffers["subtokenizer.lookup_table"][:, 0].tolist() == list(range(513))


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
def test_udm_base_is_published_without_a_mask(tmp_path: Path) -> None:
    """The uniform-state recipe: adapted from the published MDM without its [MASK] row, trained under the
    UDM objective, published in the MDM's layout minus the mask; it reads back as a UDM."""
    out = tmp_path / "published"
    udm = RECIPES["udm"]
    card = train_base(tmp_path / "work", out, recipe=_tiny(udm, 2, 2), echo=[].append)
    assert card.family == "udm" and card.mask_id is None and card.padded_vocab_size == 513
    assert card.adapted_from == "longctx-demo-mdm-base" and "MDM → UDM" in (out / "MODEL_CARD.md").read_text()
    spec = json.loads((tmp_path / "work" / udm.phases[-1].name / "train_spec.json").read_text())
    assert spec["objective"]["kind"] == "udm" and spec["padded_vocab_size"] == 513
    fam = inspect_checkpoint(out / "base_model_only.tar").family
    assert (fam.label, fam.block, fam.mask_id) == ("UDM (objective unknown)", "encoder", None)
    assert (fam.input_vocab_rows, fam.output_vocab_rows) == (513, 513)
    save = tmp_path / "run" / "base" / "checkpoints"
    install_published(out, tmp_path / "run" / "tokenizer", save)
    buffers = saved_tensors(save / "iter_0000002", prefixes=("subtokenizer.",))
    assert set(buffers) == {"subtokenizer.lookup_table"}


def test_every_family_has_a_recipe() -> None:
    assert [recipe_for(f).objective.kind for f in ("ar", "mdm", "udm")] == ["ar", "mdm", "udm"]
    # the UDM starts from the MDM's weights, and its bar is read on single needles alone
    assert recipe_for("udm").adapt_from == "mdm" and recipe_for("udm").bar_tasks == ("single",)
    with pytest.raises(StageError, match="no published demo base for the 'gpt' family"):
        recipe_for("gpt")


def test_the_published_recipes_keep_the_bar() -> None:
    assert all(r.publish_bar == 0.9 for r in RECIPES.values())


def test_a_base_below_its_bar_is_not_published() -> None:
    from longctx.demo.published import Retrieval
    from longctx.demo.train_base import require_publishable

    r = RECIPES["ar"]
    good = [Retrieval(task=t, length=256, keys=100, exact=0.95) for t in r.eval_tasks]
    require_publishable(r, good)
    weak = Retrieval(task="multikey-4", length=256, keys=100, exact=0.25)  # copies a key, not the asked one
    with pytest.raises(
        StageError, match=r"below the 90 % .* window of 256 tokens \(multikey-4: 25 % of 100 keys\)"
    ):
        require_publishable(
            r, [*good[:2], weak, Retrieval(task="multikey-4", length=1024, keys=100, exact=1.0)]
        )
    with pytest.raises(StageError, match="multikey-2: not measured"):
        require_publishable(r, [good[0], good[2]])
    # a recipe whose bar is single needles alone publishes its weak multi-key figures on its card
    require_publishable(dataclasses.replace(r, bar_tasks=("single",)), [good[0], weak])


def test_the_work_directory_is_claimed_for_one_recipe(tmp_path: Path) -> None:
    from longctx.demo.train_base import RECIPE_FILE, claim_work_dir

    other = tmp_path / "other-run"
    (other / "checkpoints").mkdir(parents=True)
    (other / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("5000\n")
    with pytest.raises(StageError, match="holds something else"):
        claim_work_dir(other, RECIPES["ar"])
    assert not (other / RECIPE_FILE).exists()
    work = tmp_path / "work"
    claim_work_dir(work, RECIPES["ar"])
    longer = tuple(dataclasses.replace(p, iterations=9000) for p in RECIPES["ar"].phases)
    claim_work_dir(work, dataclasses.replace(RECIPES["ar"], phases=longer))  # trains further: the same base
    with pytest.raises(StageError, match="differs in: phases"):
        fewer = dataclasses.replace(RECIPES["ar"], phases=RECIPES["ar"].phases[:1])
        claim_work_dir(work, fewer)
    with pytest.raises(
        StageError,
        match="another recipe \\(differs in: adapt_from, family, name, objective, output_vocab_size",
    ):
        claim_work_dir(work, RECIPES["mdm"])
    from longctx.util.shipped import resource_dir

    with pytest.raises(StageError, match="inside the installed package"):
        claim_work_dir(resource_dir("demo", "ar"), RECIPES["ar"])


class _StoppedLaunch:
    """A launch that was asked to stop before its first save: it exits 0 and leaves no checkpoint."""

    def __init__(self, echo: bool = False) -> None:
        pass

    def run(self, argv: list[str], *, nproc: int, env: dict[str, str], log: Path) -> int:
        return 0


def test_a_stopped_phase_ends_the_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A phase whose launch stopped short (SIGTERM, Ctrl-C: the trainer saves and exits 0) is not done:
    the next phase must not start from its weights, and nothing is measured or published."""
    monkeypatch.setattr("longctx.demo.train_launch.LocalLauncher", _StoppedLaunch)
    work, out = tmp_path / "work", tmp_path / "out"
    with pytest.raises(StageError, match="phase copy stopped at iteration 0 of 2") as err:
        train_base(work, out, recipe=_tiny(RECIPES["ar"], 2, 2), echo=[].append)
    assert "resumes" in (err.value.fix or "")
    assert not (work / "lookup").exists() and not out.exists()


def test_train_base_cli_refuses_a_directory_of_another_run(tmp_path: Path) -> None:
    from tests.bad_input.harness import refused

    other = tmp_path / "other-run"
    (other / "copy" / "data").mkdir(parents=True)
    (other / "copy" / "data" / "copy_text_document.idx").write_bytes(b"MMIDIDX")
    refused(["demo", "--train-base", "--dir", other], [tmp_path], needle="holds something else")


def test_train_base_takes_the_run_lock(tmp_path: Path) -> None:
    from longctx.demo.train_base import claim_work_dir
    from longctx.stage.lock import run_lock

    work = tmp_path / "work"
    claim_work_dir(work, RECIPES["ar"])
    with run_lock(work, "train-base"), pytest.raises(StageError, match="lock"):
        train_base(work, tmp_path / "out", recipe=RECIPES["ar"], echo=[].append)
    assert not (tmp_path / "out").exists()
