"""The preflight parent and its child speak through one definition (longctx.stage.preflight_protocol): the
request the parent writes is the one the child reads, and the child's reply becomes the report.

The child runs here against a stand-in checkout (a `megatron.training` of a few lines whose parser knows no
flag), so the round trip needs no Megatron-LM."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from longctx.stage import preflight
from longctx.stage.preflight import DeviceFacts, PreflightError, StageJob, require_passed, run_preflight
from longctx.stage.preflight_protocol import PreflightReply, PreflightRequest

FACTS = DeviceFacts("test: A100", gpu_arch=(8, 0), env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"})
JOB = StageJob("s1", ["--bogus-flag", "7"], world_size=8, gpus_per_node=4, rotary_base=5e5, seq_length=4096)

STAND_IN = {
    "megatron/__init__.py": "",
    "megatron/training/__init__.py": "from megatron.training.training import pretrain\n",
    "megatron/training/training.py": "def pretrain(*args, **kwargs):\n    raise RuntimeError('not in a preflight')\n",
    "megatron/training/arguments.py": textwrap.dedent("""\
        import argparse

        def parse_args(extra_args_provider=None, ignore_unknown_args=False):
            return argparse.ArgumentParser(prog="pretrain_gpt.py").parse_args()
        """),
    "pretrain_gpt.py": textwrap.dedent("""\
        from megatron.training import pretrain

        def model_provider(pre_process=True, post_process=True):
            raise RuntimeError("no model here")

        pretrain(None, model_provider, None, None, args_defaults={})
        """),
}


def test_the_request_the_parent_writes_is_the_one_the_child_reads(tmp_path: Path) -> None:
    script = tmp_path / "pretrain_gpt.py"
    request = preflight._request(script, tmp_path / "result.json", ["/opt/x"], [JOB], FACTS)
    read = PreflightRequest.model_validate_json(request.model_dump_json())
    assert read == request
    [stage] = read.stages
    assert (stage.stage, stage.argv, stage.world_size, stage.gpus_per_node) == ("s1", JOB.argv, 8, 4)
    assert (stage.rotary_base, stage.seq_length, stage.cuda_device_max_connections) == (5e5, 4096, "1")
    assert read.facts.gpu_arch == (8, 0) and read.sys_path == ["/opt/x"]


@pytest.mark.timeout(240)
def test_the_childs_reply_becomes_the_report(tmp_path: Path) -> None:
    for rel, text in STAND_IN.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    report = run_preflight(tmp_path / "pretrain_gpt.py", [JOB], FACTS, timeout=200)
    assert report.error is None, report.lines()
    [stage] = report.stages
    assert (stage.stage, stage.world_size) == ("s1", 8)
    assert [(c.name, c.ok) for c in stage.checks] == [("entry-script", True), ("parse_args", False)]
    assert stage.model_provider == "__main__.model_provider"
    failure = stage.failure
    assert failure is not None and "unrecognized arguments: --bogus-flag 7" in (failure.message or "")
    assert report.to_json()["stages"][0]["failure"]["name"] == "parse_args"
    with pytest.raises(PreflightError, match="refuses stage s1 at parse_args"):
        require_passed(report)


@pytest.mark.parametrize("content", ["", '{"stages": [{"stage": 3}]}', '{"stages": [], "surprise": 1}'])
def test_an_unreadable_reply_is_the_preflights_error_not_a_traceback(tmp_path: Path, content: str) -> None:
    path = tmp_path / "result.json"
    path.write_text(content)
    reply, why = preflight._read_reply(path)
    assert reply == PreflightReply() and why is not None and why.startswith("an unreadable result (")
    assert preflight._read_reply(tmp_path / "absent.json") == (PreflightReply(), "no result written")
