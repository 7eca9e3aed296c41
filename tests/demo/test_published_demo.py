"""The demo's published path on a small plan: the published base is adopted (md5s checked, ckpt adopt),
its tokenizer checked against the pinned manifest, stage data built per stage, two stages (the second
with CP 2) extend it, and the evaluation reads every checkpoint; a rerun resumes. For both published
families: the autoregressive base, and the masked- and uniform-state diffusion ones stored in Ermine's
predecessor layout."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.demo.published import family_dir, read_card
from longctx.demo.run import Corpus, DemoConfig, run_demo


def _plan(path: Path, run_dir: Path, family: str) -> Path:
    card = read_card(family_dir(family))
    a = card.arch
    objective = "" if family == "ar" else f'[objective]\nkind = "{family}"'
    blend = '[[0.3, "${RUN_DIR}/data/short_text_document"], [0.7, "${RUN_DIR}/data/long_text_document"]]'
    path.write_text(
        textwrap.dedent(f"""\
        name = "published-small"
        run_dir = "{run_dir}"
        [base]
        path = "${{RUN_DIR}}/base/checkpoints"
        seq_length = {card.seq_length}
        rotary_base = {card.rotary_base}
        model_only = true
        [tokenizer]
        path = "${{RUN_DIR}}/tokenizer"
        manifest = "{family_dir(family) / "tokenizer.toml"}"
        {objective}
        [model]
        num_layers = {a.num_layers}
        hidden_size = {a.hidden_size}
        ffn_hidden_size = {a.ffn_hidden_size}
        num_attention_heads = {a.num_attention_heads}
        num_query_groups = {a.num_query_groups}
        kv_channels = {a.kv_channels}
        [cluster]
        profile = "local"
        gpus_per_node = 2
        gpu_memory_gib = 8
        [local]
        eval_after_stage = false
        threads_per_process = 1
        [eval]
        # what the test reads is a row per checkpoint: one key per cell, one held-out document for the
        # loss by position, no short-context documents and no packed windows
        keys_per_cell = 1
        loss_docs = 1
        short_docs = 0
        packed_windows = 0
        [defaults]
        nodes = 1
        log_interval = 1
        [defaults.lr]
        lr = 1e-3
        min_lr = 1e-4
        warmup_fraction = 0.2
        [[stages]]
        name = "512"
        seq_length = 512
        tokens = 8192
        global_batch_size = 4
        save_interval = 2
        rope = {{ method = "men-safe", params = {{ source = "exact" }} }}
        data = {{ blend = {blend}, split = "90,10,0", packing = "documents" }}
        [[stages]]
        name = "1k"
        seq_length = 1024
        tokens = 4096
        global_batch_size = 1
        context_parallel = 2
        save_interval = 2
        rope = {{ method = "men-safe", params = {{ source = "exact" }} }}
        data = {{ blend = {blend}, split = "90,10,0", packing = "documents" }}
        """)
    )
    return path


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a whole demo run: minutes, more when other jobs share the cores
@pytest.mark.parametrize("family", ["ar", "mdm", "udm"])
def test_demo_adopts_the_published_base_and_extends_it(tmp_path: Path, family: str) -> None:
    run_dir = tmp_path / "demo"
    card = read_card(family_dir(family))
    cfg = DemoConfig(
        plan=_plan(tmp_path / "plan.toml", run_dir, family),
        published=family,
        corpora=(Corpus("short", 300, 80, 170, 11), Corpus("long", 60, 700, 1400, 12)),
        interrupt_stage=None,
    )
    lines: list[str] = []
    report = run_demo(run_dir, cfg, echo=lines.append)
    assert [s.step for s in report.steps] == [
        "published base",
        "corpus",
        "data",
        "checks",
        "stages",
        "evaluation",
    ]
    adopted = report.steps[0].detail
    assert card.archive_md5 in adopted and card.tokenizer_md5 in adopted and "match the card" in adopted
    assert [r["status"] for r in report.stages] == ["done", "done"]
    ev = report.evaluation
    assert ev is not None and {row["checkpoint"] for row in ev["table"]} >= {"base", "512", "1k"}
    if family != "ar":  # evaluated by infilling; every stage saved in the base's layout, buffers kept
        assert any("infilling" in n for n in ev["notes"])
        last = inspect_checkpoint(run_dir / "stages" / "1k" / "checkpoints").family
        assert (
            last.label.startswith(family.upper()) and last.block == "encoder" and last.mask_id == card.mask_id
        )

    again = run_demo(run_dir, cfg, echo=lines.append)
    assert all(s.skipped for s in again.steps if s.step in ("published base", "corpus", "data"))
