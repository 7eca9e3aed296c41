"""`data check` passes on good datasets and fails, with the specific message and exit 2, on each bad input."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from longctx.cli.main import app
from longctx.data import check_datasets, fingerprint_dataset, read_index, read_sidecar, tokenize_jsonl
from longctx.errors import DatasetError
from tests.fixtures.data import write_indexed_dataset
from tests.fixtures.tokenizer import OELLM_LIKE_VOCAB

runner = CliRunner()
VOCAB = OELLM_LIKE_VOCAB + 1  # len(tokenizer) of the HF directory
EOD = 2


def cli(*args: object):
    return runner.invoke(app, ["data", "check", *[str(a) for a in args]])


def _copy(prefix: str, dest: Path) -> str:
    out = str(dest / Path(prefix).name)
    for ext in (".bin", ".idx", ".longctx.json"):
        if Path(prefix + ext).exists():
            shutil.copy(prefix + ext, out + ext)
    return out


def _docs(n: int = 6, length: int = 50, *, eod: bool = True, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        d = rng.integers(3, OELLM_LIKE_VOCAB, size=length).tolist()
        docs.append([*d, EOD] if eod else d)
    return docs


# -- good datasets ---------------------------------------------------------------------------------------
def test_tokenized_dataset_passes(oellm_like_dataset: str, oellm_like_hf_dir: Path) -> None:
    report = check_datasets(
        [oellm_like_dataset], tokenizer=oellm_like_hf_dir, lengths=[1024, 4096], progress=False
    )
    assert report.ok, report.all_findings().errors
    p = report.prefixes[0]
    info = read_index(oellm_like_dataset)
    assert p.scan is not None and p.scan.documents_checked == info.documents == p.scan.eod_count
    assert p.scan.max_id is not None and p.scan.max_id < VOCAB
    assert p.scan.bytes_scanned == info.bin_size
    assert "sidecar" in p.findings.codes("info")
    res = cli(oellm_like_dataset, "-t", oellm_like_hf_dir, "--lengths", "1K,4K", "--strict")
    assert res.exit_code == 0, res.output
    assert "data check: OK" in res.stdout


def test_builder_dataset_passes_with_a_fingerprinted_sidecar(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    docs = [*_docs(5), [[5, 6, 7], [8, EOD]], [[9], [], [10, EOD]]]  # multi-sequence documents too
    prefix = write_indexed_dataset(tmp_path / "built", docs, np.uint16)
    res = cli(prefix, "-t", oellm_like_hf_dir, "--strict")
    assert res.exit_code == 2
    assert "error: sidecar: no sidecar built.longctx.json" in res.stderr
    assert cli(prefix, "-t", oellm_like_hf_dir).exit_code == 0  # a warning without --strict
    sc = fingerprint_dataset(prefix, oellm_like_hf_dir, progress=False)
    assert sc.origin == "fingerprint" and sc.documents == 7
    assert cli(prefix, "-t", oellm_like_hf_dir, "--strict").exit_code == 0
    with pytest.raises(DatasetError, match="sidecar exists"):
        fingerprint_dataset(prefix, oellm_like_hf_dir, progress=False)


def test_lengths_and_budgets(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    lengths = [100, 300, 1000, 3000]
    docs = [[*np.full(n - 1, 7).tolist(), EOD] for n in lengths]
    prefix = write_indexed_dataset(tmp_path / "len", docs, np.uint16)
    report = check_datasets(
        [prefix],
        tokenizer=oellm_like_hf_dir,
        lengths=[256, 1024],
        budgets={"short": 2000, "long": 8800},
        progress=False,
    )
    stats = report.prefixes[0].lengths
    assert stats is not None
    assert (stats.min_length, stats.max_length, stats.tokens) == (100, 3000, 4400)
    c256, c1k = stats.coverage
    assert (c256.documents_at_least, c256.tokens_in_documents_at_least) == (3, 4300)
    assert c256.single_document_samples == 300 // 256 + 1000 // 256 + 3000 // 256
    assert c256.packed_samples == (4400 - 1) // 256
    assert (c1k.documents_at_least, c1k.single_document_samples) == (1, 2)
    assert report.prefixes[0].epochs == pytest.approx({"short": 2000 / 4400, "long": 2.0})
    assert report.prefixes[0].findings.codes("warning") == ["sidecar", "epochs"]
    res = cli(prefix, "-t", oellm_like_hf_dir, "--lengths", "4K", "--budget", "long=8800", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["ok"] is True
    assert data["prefixes"][0]["lengths"]["coverage"][0]["documents_at_least"] == 0
    assert "long-docs" in [f["code"] for f in data["prefixes"][0]["findings"] if f["level"] == "warning"]


def test_weighted_blend_shares_and_epochs(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    a = write_indexed_dataset(tmp_path / "a", _docs(4, 99), np.uint16)  # 400 tokens
    b = write_indexed_dataset(tmp_path / "b", _docs(2, 99), np.uint16)  # 200 tokens
    report = check_datasets(f"3 {a} 1 {b}", tokenizer=oellm_like_hf_dir, budgets={"s": 400}, progress=False)
    assert [p.share for p in report.prefixes] == [0.75, 0.25]
    assert [p.epochs["s"] for p in report.prefixes] == pytest.approx([0.75, 0.5])
    data_args = tmp_path / "mix.txt"
    data_args.write_text(f"3 {a}\n1 {b}\n")
    res = cli("--data-args-path", data_args, "-t", oellm_like_hf_dir)
    assert res.exit_code == 0, res.output


# -- bad inputs: one test each ---------------------------------------------------------------------------
def test_truncated_bin(oellm_like_dataset: str, oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    prefix = _copy(oellm_like_dataset, tmp_path)
    size = Path(prefix + ".bin").stat().st_size
    with open(prefix + ".bin", "r+b") as fh:
        fh.truncate(size - 6)
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    tokens = size // 2
    assert (
        f"error: bin-size: truncated .bin: {size - 6} bytes, but the index describes {tokens} tokens × 2 bytes "
        f"(uint16) = {size} bytes (expected {size}, found {size - 6})" in res.stderr
    )


def _patch_idx(prefix: str, offset: int, data: bytes) -> None:
    with open(prefix + ".idx", "r+b") as fh:
        fh.seek(offset)
        fh.write(data)


def test_bad_magic(oellm_like_dataset: str, oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    prefix = _copy(oellm_like_dataset, tmp_path)
    _patch_idx(prefix, 0, b"MMIDIDY")
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert (
        "error: idx-magic: bad magic in .idx: expected b'MMIDIDX\\x00\\x00', found b'MMIDIDY\\x00\\x00'"
        in res.stderr
    )


def test_wrong_version(oellm_like_dataset: str, oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    prefix = _copy(oellm_like_dataset, tmp_path)
    _patch_idx(prefix, 9, (2).to_bytes(8, "little"))
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert "error: idx-version: unsupported .idx version 2 (expected 1)" in res.stderr


def test_uint16_data_with_a_262144_vocab(tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "u16", _docs(3), np.uint16)
    res = cli(prefix, "--vocab-size", 262144, "--eod-id", EOD)
    assert res.exit_code == 2
    assert (
        "error: dtype-vocab: token dtype uint16 cannot hold a vocabulary of 262144 (largest id 262143; uint16 "
        "holds up to 65535)" in res.stderr
    )


def test_token_id_at_or_above_vocab(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    docs = _docs(4)
    docs[2][10] = VOCAB  # one id past the end
    docs[3][0] = VOCAB + 40
    prefix = write_indexed_dataset(tmp_path / "oov", docs, np.int32)
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert (
        f"error: token-range: 2 token ids outside 0..{VOCAB - 1} (vocab size {VOCAB}); first: id {VOCAB} at token "
        f"{2 * 51 + 10} (document 2) (expected < {VOCAB}, found {VOCAB + 40})" in res.stderr
    )


def test_negative_token_id(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    docs = _docs(2)
    docs[1][3] = -5
    prefix = write_indexed_dataset(tmp_path / "neg", docs, np.int32)
    report = check_datasets([prefix], tokenizer=oellm_like_hf_dir, progress=False)
    err = next(f for f in report.all_findings().errors if f.code == "token-range")
    assert "1 token ids outside" in err.message and "first: id -5 at token 54 (document 1)" in err.message


def test_documents_without_eod(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    docs = _docs(5)
    docs[1] = docs[1][:-1]
    docs[3] = docs[3][:-1]
    prefix = write_indexed_dataset(tmp_path / "noeod", docs, np.uint16)
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert (
        "error: eod: 2 of 5 documents do not end with EOD id 2 (first: document 1); EOD tokens in the data: 3 "
        "(expected 5, found 3)" in res.stderr
    )


def test_sidecar_md5_of_another_tokenizer(data_jsonl: Path, oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    from longctx.tokenizer import load_tokenizer, synthetic_corpus, train_sentencepiece

    corpus = synthetic_corpus(2000, seed=1)  # same layout and vocab size, other merges
    other = train_sentencepiece(corpus, tmp_path / "other", OELLM_LIKE_VOCAB, hf=True).parent
    prefix = str(tmp_path / "other_text_document")
    tokenize_jsonl([data_jsonl], other, prefix, progress=False)
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    want, got = load_tokenizer(oellm_like_hf_dir).md5, load_tokenizer(other).md5
    assert want != got
    assert (
        "error: sidecar-md5: dataset was tokenized with another tokenizer: sidecar md5 of tokenizer.model differs "
        f"from the given tokenizer's (expected {want}, found {got})" in res.stderr
    )
    assert read_sidecar(prefix).tokenizer.md5 == got  # type: ignore[union-attr]


def test_odd_blend(oellm_like_dataset: str, oellm_like_hf_dir: Path) -> None:
    res = cli("--data-path", f"0.5 {oellm_like_dataset} 0.5", "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert (
        "error: blend-odd: odd number of words (3) in a weighted blend: Megatron would take all 3 words as "
        "prefixes and silently drop every weight" in res.stderr
    )


def test_missing_prefix(oellm_like_dataset: str, oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    missing = str(tmp_path / "gone_text_document")
    res = cli("--data-path", f"0.5 {oellm_like_dataset} 0.5 {missing}", "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert (
        f"error: missing-prefix: missing prefix: {missing} "
        "(gone_text_document.idx and gone_text_document.bin not found)" in res.stderr
    )


def test_negative_weight(oellm_like_dataset: str, oellm_like_hf_dir: Path) -> None:
    res = cli("--data-path", f"-1 {oellm_like_dataset}", "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert f"error: blend-weight: pair 1: negative weight -1 for {oellm_like_dataset}" in res.stderr


def test_empty_dataset(oellm_like_hf_dir: Path, tmp_path: Path) -> None:
    prefix = write_indexed_dataset(tmp_path / "empty", [], np.uint16)
    res = cli(prefix, "-t", oellm_like_hf_dir)
    assert res.exit_code == 2
    assert "error: empty: dataset empty has no document: it is empty" in res.stderr


# -- other behaviour -------------------------------------------------------------------------------------
def test_json_error_output_and_source_rules(oellm_like_dataset: str, oellm_like_hf_dir: Path) -> None:
    res = cli(oellm_like_dataset, "--data-path", f"1 {oellm_like_dataset}")
    assert res.exit_code == 2 and "give the datasets one way" in res.stderr
    res = cli(oellm_like_dataset, "-t", oellm_like_hf_dir, "--budget", "oops")
    assert res.exit_code == 2
    res = cli(oellm_like_dataset, "-t", oellm_like_hf_dir, "--no-scan", "--json")
    data = json.loads(res.stdout)
    assert res.exit_code == 0 and data["prefixes"][0]["scan"] is None


def test_without_tokenizer_uses_the_sidecar(oellm_like_dataset: str) -> None:
    report = check_datasets([oellm_like_dataset], progress=False)
    assert report.ok
    assert report.findings.codes("warning") == ["tokenizer"]
    scan = report.prefixes[0].scan
    assert scan is not None and scan.documents_checked == read_index(oellm_like_dataset).documents


def test_plan_option(oellm_like_dataset: str, oellm_like_hf_dir: Path, repo_root: Path) -> None:
    from longctx.plan.derive import resolve_plan
    from longctx.plan.load import load_plan
    from longctx.plan.stage_data import data_needs

    rp = resolve_plan(load_plan(repo_root / "stages" / "tiny.toml"))
    lengths, budgets = data_needs(rp)
    assert lengths == [st.seq_length for st in rp.stages]
    assert budgets == {st.name: st.tokens_realized for st in rp.stages}
    assert all(n > 0 for n in budgets.values())
    res = cli(oellm_like_dataset, "-t", oellm_like_hf_dir, "--plan", repo_root / "stages" / "tiny.toml")
    assert res.exit_code == 0, res.output
