"""Every stage argv against the parser of the Megatron-LM it names, read from the shared checkouts' sources.

`../shared/megatron-lm` is 0.16.1's training code (its megatron/core is the installed wheel);
`../shared/megatron-lm-0.19` is 0.19.0's training code and megatron/core. 0.19 needs Python ≥ 3.12, so its
parser is read (longctx.stage.megatron_source), never imported; the reader is checked against 0.16.1's
real parser, which does run here.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.errors import StageError
from longctx.megatron_versions import RELEASES, facts
from longctx.plan.derive import ResolvedPlan, resolve_plan, validate_plan
from longctx.plan.load import load_plan
from longctx.stage.megatron_args import family_flags, stage_flags
from longctx.stage.megatron_source import FlagInfo, checkout_version, parser_flags

REPO = Path(__file__).resolve().parents[2]
SHARED = REPO.parent / "shared"
CHECKOUTS = {"0.16.1": SHARED / "megatron-lm", "0.19.0": SHARED / "megatron-lm-0.19"}
RUN = "lc16k_full_20260507"

pytestmark = pytest.mark.skipif(
    not all((p / "megatron" / "training" / "arguments.py").is_file() for p in CHECKOUTS.values()),
    reason=f"the shared Megatron-LM checkouts are not beside this clone ({SHARED})",
)


@pytest.fixture(scope="module")
def parsers() -> dict[str, dict[str, FlagInfo]]:
    return {v: parser_flags(root) for v, root in CHECKOUTS.items()}


@pytest.fixture
def plans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, ResolvedPlan]:
    """Every plan under stages/, resolvable here: the baby plan's artifact as a manifests-only stand-in,
    the demo plans' tokenizer manifest (written by `demo`) replaced by gpt2's."""
    from tests.fixtures.artifact import build_artifact

    art = build_artifact(tmp_path / "artifact", run=RUN)
    monkeypatch.setenv("OELLM_LONGCTX_DATA", str(art))
    monkeypatch.setenv("LONGCTX_BABY_RUN_DIR", str(tmp_path / "run"))
    monkeypatch.delenv("LONGCTX_MEGATRON_LM", raising=False)
    out = {}
    for p in sorted((REPO / "stages").glob("*.toml")):
        text = p.read_text().replace(
            "${RUN_DIR}/tokenizer/manifest.toml", str(REPO / "tokenization/gpt2.toml")
        )
        text = re.sub(r'^run_dir = "\.\./runs/', f'run_dir = "{tmp_path}/runs/', text, flags=re.M)
        copy = tmp_path / "stages" / p.name
        copy.parent.mkdir(exist_ok=True)
        text = text.replace(
            '"../demo/', f'"{REPO}/longctx/resources/demo/'
        )  # the demo base's pinned manifest
        copy.write_text(text.replace('"../tokenization/', f'"{REPO}/tokenization/'))
        out[p.stem] = resolve_plan(load_plan(copy))
    return out


def _on(rp: ResolvedPlan, version: str, **megatron: object) -> ResolvedPlan:
    """The same resolved plan with [megatron] changed (version, path)."""
    meg = rp.plan.megatron.model_copy(update={"version": version, **megatron})
    return validate_plan(rp.plan.model_copy(update={"megatron": meg}))  # resolved again, findings kept


def test_source_reader_agrees_with_the_real_0_16_parser(parsers) -> None:
    """The reader's flag set for 0.16.1 equals the option strings of its parser built for real (the only
    extras: two kitchen flags that arguments.py adds only when that optional package imports)."""
    probe = (
        "import argparse, json, sys; sys.path.insert(0, sys.argv[1]);"
        "from longctx.mcore.megatron_lm_cpu import apply_shims; apply_shims();"
        "out = {};\n"
        "def grab(self, *a, **k):\n"
        "    out.update({s: [act.nargs != 0, getattr(act.type, '__name__', None)]"
        " for s, act in self._option_string_actions.items()}); raise SystemExit\n"
        "argparse.ArgumentParser.parse_known_args = grab\n"
        "from megatron.training.arguments import parse_args\n"
        "try: parse_args()\nexcept SystemExit: pass\n"
        "print(json.dumps(out))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(CHECKOUTS["0.16.1"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    real = json.loads(done.stdout.strip().splitlines()[-1])
    read = parsers["0.16.1"]
    assert len(real) > 600
    assert set(real) - set(read) == set()
    assert set(read) - set(real) == {"--kitchen-config-file", "--kitchen-recipe-number"}
    assert {k for k in real if real[k][0] != read[k].takes_value} == set()
    # a value type read from source is the parser's own (int where Megatron wants integers)
    typed = {k for k in real if read[k].value_type is not None}
    assert len(typed) > 300
    assert {k for k in typed if real[k][1] != read[k].value_type} == set()


def test_checkout_versions() -> None:
    assert checkout_version(CHECKOUTS["0.19.0"])[0] == "0.19.0"
    v, source = checkout_version(CHECKOUTS["0.16.1"])
    assert v == "0.16.1" and "installed megatron-core" in source


def _check_argv(rp: ResolvedPlan, st, flags: dict[str, FlagInfo]) -> list[str]:
    """Every flag longctx emits for the stage, checked in `flags`; the fork's own flags are its parser's."""
    own = {f.name for f in family_flags(rp, st)}
    checked = []
    for f in stage_flags(rp, st):
        if f.name in own:
            continue
        assert f.name in flags, f"{rp.plan.name}/{st.name} on {rp.plan.megatron.version}: {f.name} unknown"
        assert flags[f.name].takes_value == bool(f.values), f"{f.name}: value or switch?"
        kind = {"int": int, "float": float}.get(flags[f.name].value_type or "")
        for value in f.values if kind else ():
            kind(value)  # ValueError: Megatron's parser would refuse the word
        checked.append(f.name)
    return checked


@pytest.mark.parametrize("version", sorted(CHECKOUTS))
def test_every_stage_argv_exists_in_that_versions_parser(plans, parsers, version: str) -> None:
    checked, refused = 0, []
    for name, rp in plans.items():
        on = _on(rp, version)
        for st in on.launchable():  # a stage pending its RoPE sweep: the branches' argv
            try:
                names = _check_argv(on, st, parsers[version])
            except StageError as e:  # plans only the local backend trains: refused by the argv builder
                refused.append(f"{name}/{st.name}")
                local_only = ("autoregressive objective", "packing", "attention logits")
                assert any(why in str(e) for why in local_only), str(e)
                continue
            checked += 1
            assert "--rotary-base" in names and "--seq-length" in names
    # diffusion plans without a fork's entry script train on the local backend only
    local_only = {
        n for n, rp in plans.items() if rp.objective.kind != "ar" and rp.plan.megatron.family_args == []
    }
    assert local_only == {"ermine_udm_moe", "tiny_mdm", "tiny_udm"}
    expected = {f"{n}/{s.name}" for n in local_only for s in plans[n].launchable()}
    # the demo packs by document, which Megatron-LM's pretraining runs from 0.19 and there at CP 1 only
    expected |= {
        f"{n}/{s.name}"
        for n in ("tiny", "tiny_16k")
        for s in plans[n].launchable()
        if version == "0.16.1" or s.cp > 1
    }
    assert sorted(refused) == sorted(expected)
    assert (
        checked
        == sum(len(rp.launchable()) for rp in plans.values()) - len(refused)
        == (9 if version == "0.16.1" else 11)
    )


def test_baby_128k_on_0_19_through_the_cli(plans, parsers, tmp_path: Path) -> None:
    """`longctx stage args stages/baby_9b_dense.toml 128k` with [megatron] version = "0.19": every flag in
    0.19's parser source; the 0.16-only --exit-signal kept (0.19 still has it)."""
    src = tmp_path / "stages" / "baby_9b_dense.toml"
    text = src.read_text().replace('version = "0.16.0"', 'version = "0.19"')
    plan = tmp_path / "stages" / "baby_019.toml"
    plan.write_text(text)
    r = CliRunner().invoke(app, ["stage", "args", str(plan), "128k", "--json"])
    assert r.exit_code == 0, r.output
    words = json.loads(r.stdout)
    flags = [w for w in words[1:] if w.startswith("--")]
    assert len(flags) > 40
    assert [f for f in flags if f not in parsers["0.19.0"]] == []
    assert "--exit-signal" in flags


def test_release_table_against_both_sources(parsers) -> None:
    """Each row's flags: added ones absent before and present in the checkout of that line or later,
    removed ones present in 0.16 and gone in 0.19."""
    old, new = parsers["0.16.1"], parsers["0.19.0"]
    for r in RELEASES:
        for flag in r.adds:
            assert flag in new, flag
            assert (flag in old) == (r.version <= (0, 16, 1)), flag
        for flag in r.removes:
            assert flag in old and flag not in new, flag
    assert facts("0.16.1").has_flag("--legacy-tokenizer") and not facts("0.19").has_flag("--legacy-tokenizer")


def _read(*parts: str) -> str:
    return (CHECKOUTS["0.19.0"].joinpath(*parts)).read_text(encoding="utf-8")


def test_tokenizer_and_rope_facts_against_the_0_19_source() -> None:
    """HF defaults (fast, special tokens) and the switches that turn them off; YaRN and PI reaching GPT."""
    build = _read("megatron", "core", "tokenizers", "utils", "build_tokenizer.py")
    assert "kwargs['use_fast'] = not args.tokenizer_hf_no_use_fast" in build
    assert "kwargs['include_special_tokens'] = not args.tokenizer_hf_no_include_special_tokens" in build
    f19, f16 = facts("0.19.0"), facts("0.16.1")
    assert f19.hf_defaults == {"use_fast": True, "include_special_tokens": True}
    assert f16.hf_defaults == {"use_fast": False, "include_special_tokens": False}
    utils = _read("megatron", "training", "argument_utils.py")
    for attr, arg in [
        ("yarn_rotary_scaling_factor", "rotary_scaling_factor"),
        ("yarn_mscale", "mscale"),
        ("yarn_mscale_all_dim", "mscale_all_dim"),
        ("yarn_original_max_position_embeddings", "yarn_original_max_position_embeddings"),
    ]:
        assert f"_set('{attr}', args.{arg}," in utils
    assert 'kwargs["seq_len_interpolation_factor"] = args.rotary_seq_len_interpolation_factor' in utils
    assert "gpt_config_from_args(args)" in _read("pretrain_gpt.py")
    assert f19.cli_yarn and f19.cli_pi and not f16.cli_yarn and not f16.cli_pi
    # 0.16's GPT builder passes neither (only MLA reads --rotary-scaling-factor / --mscale there)
    gpt16 = (CHECKOUTS["0.16.1"] / "gpt_builders.py").read_text(encoding="utf-8")
    assert "seq_len_interpolation_factor" not in gpt16 and "rotary_scaling_factor" not in gpt16
    # the llama3 factor is never passed to GPT, in either version
    assert "rope_scaling_factor" not in gpt16 and "rope_scaling_factor" not in _read("gpt_builders.py")


def test_refused_version_mismatch(plans) -> None:
    rp = plans["baby_9b_dense"]
    rp = _on(rp, rp.plan.megatron.version, path=str(CHECKOUTS["0.19.0"]))
    with pytest.raises(StageError, match=r"Megatron-LM 0\.16\.0 .* is 0\.19\.0") as e:
        stage_flags(rp, rp.stage("16k"))
    assert 'version = "0.19.0"' in (e.value.fix or "")
    stage_flags(_on(rp, "0.19.0"), rp.stage("16k"))  # the matching version renders


def test_refused_removed_flag_and_dropped_rope_flag(plans) -> None:
    rp = plans["baby_9b_dense"]
    st = rp.stage("16k")
    legacy = type(st)(**{**st.__dict__, "extra_args": ["--legacy-tokenizer"]})
    stage_flags(_on(rp, "0.16.1"), legacy)
    with pytest.raises(
        StageError, match=r"--legacy-tokenizer does not exist in Megatron-LM 0\.19 \(removed in 0\.17"
    ):
        stage_flags(_on(rp, "0.19"), legacy)
    scaled = type(st)(**{**st.__dict__, "extra_args": ["--rotary-scaling-factor", "4"]})
    with pytest.raises(
        StageError, match=r"--rotary-scaling-factor is accepted but ignored for GPT .* 0\.16\.1"
    ):
        stage_flags(_on(rp, "0.16.1"), scaled)


def test_cli_refuses_a_checkout_of_another_release(plans, tmp_path: Path) -> None:
    """`stage args` on a plan saying 0.16 whose [megatron].path is the 0.19 checkout: exit 2, both named;
    an unreadable version is refused when the plan loads."""
    text = (tmp_path / "stages" / "baby_9b_dense.toml").read_text()
    mismatch = tmp_path / "stages" / "baby_on_019_checkout.toml"
    mismatch.write_text(
        text.replace('version = "0.16.0"', f'version = "0.16.0"\npath = "{CHECKOUTS["0.19.0"]}"')
    )
    r = CliRunner().invoke(app, ["stage", "args", str(mismatch), "16k"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    err = " ".join(r.stderr.split())
    assert (
        "the plan says Megatron-LM 0.16.0 ([megatron] version) but the checkout" in err and "is 0.19.0" in err
    )
    bad = tmp_path / "stages" / "baby_bad_version.toml"
    bad.write_text(text.replace('version = "0.16.0"', 'version = "latest"'))
    r = CliRunner().invoke(app, ["stage", "args", str(bad), "16k"])
    assert r.exit_code == 2 and "cannot read a Megatron-LM version from 'latest'" in " ".join(
        r.stderr.split()
    )


def test_packed_documents_facts_match_the_sources() -> None:
    """The release table's packed-documents facts, re-read from both sources: 0.16.1 has no way to give a
    pretraining batch its document boundaries; 0.19 has one, whose CP split cuts each row as a whole (not
    per document) and leaves cu_seqlens describing the whole row."""
    from longctx.megatron_versions import packed_documents

    old = (CHECKOUTS["0.16.1"] / "megatron" / "training" / "arguments.py").read_text()
    assert "--dataloader-inter-document-masking" not in old and facts("0.16.1").packed_documents == "none"
    root = CHECKOUTS["0.19.0"]
    entry = (root / "pretrain_gpt.py").read_text()
    assert "use_per_sequence_balancing=args.dataloader_inter_document_masking" in entry
    utils = (root / "megatron" / "core" / "utils.py").read_text()
    body = utils[utils.index("def _get_batch_on_this_cp_rank_per_sequence_balancing(") :]
    body = body[: body.index("\ndef ", 1)]
    # the whole row in 2·CP chunks, rank r keeping chunks r and 2·CP−1−r; the boundaries untouched
    assert "2 * cp_size" in body and "2 * cp_size - cp_rank - 1" in body
    assert re.search(r"METADATA_KEYS = \(\s*'cu_seqlens'", body)
    assert "cu_seqlens" not in body[body.index("if cp_size > 1:") :].replace("METADATA_KEYS", "")
    assert facts("0.19.0").packed_documents == "cp1"
    assert packed_documents("0.19.0", 1, True).ok and not packed_documents("0.19.0", 2, True).ok
