"""`data tokenize`: JSONL → Megatron `.bin/.idx` with megatron-core's own builder, plus a sidecar.

The `.bin/.idx` are byte for byte those of Megatron-LM's `tools/preprocess_data.py` with the same
tokenizer, `--tokenizer-type` and options (`--legacy-tokenizer`, `--tokenizer-hf-*`), `--json-keys
KEY` and `--append-eod` (or not), for any number of workers: one document per JSON line, encoded by
the same backend (`longctx.tokenizer.backend`); a field holding a list of strings is a document of
one sequence per string (strings without tokens left out); EOD after the last token of a document
that has tokens; a document without tokens written empty; the token dtype from the vocabulary size
Megatron's tokenizer reports. On top, blank lines are skipped (Megatron stops at them), several
inputs and `.gz` are read in order, and `add_bos` prepends BOS (no Megatron equivalent). With a
Megatron-LM release (`megatron_version`), a tokenizer type without options encodes as that release's
defaults do (HuggingFaceTokenizer: slow and without special tokens up to 0.16, fast and with them from
0.17), and the sidecar records the release and the preprocess_data.py flags in its terms.

Worker processes parse and encode batches of lines; the main process reads the inputs (hashing them
on the way) and writes documents in input order. Output appears atomically: everything is written
under temporary names beside the prefix and renamed at the end, so a failure leaves no half-written
prefix behind.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gzip
import hashlib
import json
import multiprocessing as mp
import os
import shutil
import signal
import threading
import uuid
import warnings
import zlib
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from longctx import __version__
from longctx.data.indexed import bin_path, idx_path, optimal_dtype
from longctx.data.sidecar import DatasetSidecar, SidecarInput, SidecarTokenizer, sidecar_path, write_sidecar
from longctx.errors import DatasetError, LongctxError, TokenizerError
from longctx.megatron_versions import facts
from longctx.tokenizer import EncodingSpec, LoadedTokenizer, load_tokenizer
from longctx.tokenizer.backend import single_threaded
from longctx.tokenizer.encoding import GPT2_TYPE, SP_TYPES, version_flags, version_spec
from longctx.util.confine import is_within, refuse_write_into
from longctx.util.fs import fsync_dir
from longctx.util.progress import progress_bar

if TYPE_CHECKING:  # megatron-core pulls in torch; tokenize_jsonl imports it when it runs
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

BATCH_LINES = 256
BATCH_BYTES = 1024 * 1024  # a few batches per worker even for small inputs: workers finish together
# bounds per input: one JSONL line (a document; tokenizing one string costs ~150× its size in memory),
# and what a gzip'd input may decompress to (text compresses < 20×; a bomb of blank lines ~1000×)
MAX_LINE_BYTES = 16 << 20
MAX_GZIP_RATIO = 50
GZIP_RATIO_FLOOR = 4 << 20  # bytes decompressed before the ratio is judged

# -- worker side ---------------------------------------------------------------------------------------
_worker: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class _Job:
    tokenizer_path: str
    spec: EncodingSpec
    json_key: str
    add_bos: bool
    append_eod: bool


def _init_worker(job: _Job, in_pool: bool = False, tok: LoadedTokenizer | None = None) -> None:
    if in_pool:  # one encoding thread per worker process, as Megatron's workers
        single_threaded()
    if tok is None:
        tok = load_tokenizer(job.tokenizer_path, spec=job.spec)
    _worker["tok"] = tok
    _worker["job"] = job
    _worker["eod"] = tok.backend.eod_id


def _encode_batch_safe(
    batch: tuple[str, int, list[bytes]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int] | dict[str, Any]:
    """Like `_encode_batch`, but hands errors back as data (exceptions lose where/fix when pickled)."""
    try:
        return _encode_batch(batch)
    except LongctxError as err:
        return err.to_json()


def _sentences(raw: bytes, key: str, source: str, lineno: int) -> list[str]:
    try:
        obj = json.loads(raw)
    except RecursionError:
        raise DatasetError(
            f"line {lineno} nests JSON deeper than Python's parser goes",
            where=f"{source}:{lineno}",
            fix="every line of a JSONL input must be one flat JSON object",
        ) from None
    except ValueError as err:  # JSONDecodeError, UnicodeDecodeError, an integer of more than 4300 digits
        raise DatasetError(
            f"line {lineno} is not valid JSON ({err})",
            where=f"{source}:{lineno}",
            fix="every line of a JSONL input must be one JSON object",
        ) from None
    if not isinstance(obj, dict) or key not in obj:
        found = ", ".join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__
        raise DatasetError(
            f"line {lineno} has no {key!r} field",
            where=f"{source}:{lineno}",
            fix=f"choose the text field with --json-key (found: {found})",
        )
    text = obj[key]
    texts = [text] if isinstance(text, str) else text
    if isinstance(texts, list) and all(isinstance(t, str) for t in texts):
        for t in texts:
            _require_encodable(t, source, lineno)
        return texts  # Megatron: one sequence per string
    raise DatasetError(
        f"line {lineno}: field {key!r} is {type(text).__name__}, not text (or a list of texts)",
        where=f"{source}:{lineno}",
        fix=f"make {key!r} a string on every line, or name the text field with --json-key",
    )


def _require_encodable(text: str, source: str, lineno: int) -> None:
    """JSON's \\ud800 escapes decode to lone surrogates, which no tokenizer (nor UTF-8) can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise DatasetError(
            f"line {lineno} holds a lone surrogate ({text[err.start]!r} at character {err.start}), which is not text",
            where=f"{source}:{lineno}",
            fix="write characters outside the BMP as one character or a surrogate pair (\\ud83d\\ude00), not half",
        ) from None


def _encode_batch(batch: tuple[str, int, list[bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """(flat token ids, sequences per document, tokens per sequence, blank lines) for a batch of lines."""
    source, first_line, lines = batch
    tok: LoadedTokenizer = _worker["tok"]
    job: _Job = _worker["job"]
    docs: list[list[str]] = []
    blank = 0
    for offset, raw in enumerate(lines):
        if not raw.strip():
            blank += 1
            continue
        docs.append(_sentences(raw, job.json_key, source, first_line + offset))
    flat_texts = [t for doc in docs for t in doc]
    encoded = iter(tok.encode_batch(flat_texts) if flat_texts else [])
    ids: list[int] = []
    seq_lengths: list[int] = []
    seqs_per_doc: list[int] = []
    for doc in docs:
        n_seqs = 0
        for _ in doc:
            seq = next(encoded)
            if not seq:  # Megatron leaves out sentences without tokens
                continue
            if job.add_bos and n_seqs == 0:
                seq = [tok.bos_id, *seq]  # type: ignore[list-item]  # checked before starting
            ids.extend(seq)
            seq_lengths.append(len(seq))
            n_seqs += 1
        if n_seqs and job.append_eod:
            ids.append(_worker["eod"])
            seq_lengths[-1] += 1
        seqs_per_doc.append(n_seqs)
    return (
        np.asarray(ids, dtype=np.int64),
        np.asarray(seqs_per_doc, dtype=np.int64),
        np.asarray(seq_lengths, dtype=np.int64),
        blank,
    )


# -- main side -----------------------------------------------------------------------------------------
class _HashingReader:
    """Binary reader over a (possibly gzipped) file that hashes and counts the raw bytes it reads."""

    def __init__(self, path: Path) -> None:
        self.raw = open(path, "rb")  # noqa: SIM115  # closed in close()
        self.sha = hashlib.sha256()
        self._hashing = _Tee(self.raw, self.sha)
        self.gzipped = path.suffix == ".gz"
        stream = gzip.GzipFile(fileobj=self._hashing) if self.gzipped else self._hashing
        self.stream: IO[bytes] = stream  # type: ignore[assignment]

    def position(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        self.raw.close()


class _Tee:
    def __init__(self, raw: IO[bytes], sha: Any) -> None:
        self.raw, self.sha = raw, sha

    def read(self, n: int = -1) -> bytes:
        data = self.raw.read(n)
        self.sha.update(data)
        return data

    def readline(self, n: int = -1) -> bytes:
        data = self.raw.readline(n)
        self.sha.update(data)
        return data

    def __iter__(self) -> Iterator[bytes]:
        while line := self.readline():
            yield line


def _batches(
    path: Path, reader: _HashingReader, advance: Callable[..., None]
) -> Iterator[tuple[str, int, list[bytes]]]:
    lines: list[bytes] = []
    size = 0
    first = 1
    lineno = 0
    last_pos = 0
    out = 0
    while line := reader.stream.readline(MAX_LINE_BYTES + 1):
        lineno += 1
        out += len(line)
        _check_bounds(path, reader, lineno, line, out)
        lines.append(line)
        size += len(line)
        if len(lines) >= BATCH_LINES or size >= BATCH_BYTES:
            pos = reader.position()
            advance(pos - last_pos)
            last_pos = pos
            yield (str(path), first, lines)
            lines, size, first = [], 0, lineno + 1
    if lines:
        yield (str(path), first, lines)
    advance(reader.position() - last_pos)


def _check_bounds(path: Path, reader: _HashingReader, lineno: int, line: bytes, out: int) -> None:
    """DatasetError for a line over MAX_LINE_BYTES, or a gzip'd input decompressing past its bound."""
    if len(line) > MAX_LINE_BYTES:
        raise DatasetError(
            f"line {lineno} is longer than {MAX_LINE_BYTES >> 20} MiB; one document costs ~150× its size in "
            "memory to tokenize",
            where=f"{path}:{lineno}",
            fix=f"split documents longer than {MAX_LINE_BYTES >> 20} MiB into several lines; nothing was written",
        )
    if reader.gzipped and out > GZIP_RATIO_FLOOR and out > MAX_GZIP_RATIO * max(1, reader.position()):
        raise DatasetError(
            f"{path.name} decompresses to more than {MAX_GZIP_RATIO}× its size ({out:,} bytes from "
            f"{reader.position():,}); text compresses far less, so this is not a JSONL corpus (a gzip bomb?)",
            where=str(path),
            fix="check the file (zcat FILE | head); give the plain JSONL if it is real; nothing was written",
        )


def _start_pool(workers: int, job: _Job) -> ProcessPoolExecutor:
    # fork where available: no re-import of __main__ (works from notebooks and stdin scripts); workers
    # start here, before the progress thread exists, and touch only the tokenizer
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context(method),
        initializer=_init_worker,
        initargs=(job, True),
    )
    for fut in [pool.submit(_ping) for _ in range(workers)]:
        fut.result()
    return pool


def _ping() -> None:
    return None


def _ordered(pool: ProcessPoolExecutor, batches: Iterator[Any], in_flight: int) -> Iterator[Any]:
    """Results in input order with at most `in_flight` batches queued: memory stays bounded however
    large the input (Pool.imap would read the whole input ahead); a dead worker raises instead of hanging."""
    pending: collections.deque[Future[Any]] = collections.deque()
    for batch in batches:
        pending.append(pool.submit(_encode_batch_safe, batch))
        if len(pending) >= in_flight:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def _check_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    if not inputs:
        raise DatasetError("no input files", fix="pass one or more JSONL files")
    paths = [Path(p) for p in inputs]
    for p in paths:
        if not p.is_file():
            raise DatasetError(f"input not found: {p}", where=str(p), fix="check the path")
        if p.suffix in (".zst", ".zstd", ".xz", ".bz2"):
            raise DatasetError(
                f"unsupported compression {p.suffix}",
                where=str(p),
                fix="decompress first (plain JSONL and .gz are read directly)",
            )
    return paths


def tokenize_jsonl(
    inputs: Sequence[str | os.PathLike[str]],
    tokenizer: LoadedTokenizer | str | os.PathLike[str],
    output_prefix: str | os.PathLike[str],
    *,
    json_key: str = "text",
    workers: int = 1,
    force: bool = False,
    add_bos: bool = False,
    append_eod: bool = True,
    spec: EncodingSpec | str | None = None,
    progress: bool = True,
    megatron_version: str | None = None,
) -> DatasetSidecar:
    """Tokenize JSONL files into `output_prefix.{bin,idx}` + `output_prefix.longctx.json`; returns the sidecar.

    `tokenizer` is a path or a `LoadedTokenizer`; `spec` the Megatron tokenizer type (and options) to
    encode as (default: the tokenizer's own, or with `megatron_version` that release's defaults for the
    tokenizer's type; see `encoding_tokenizer`). Refuses an existing prefix unless `force`, and a
    tokenizer whose files and encoding backend disagree.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        # lazy: megatron-core pulls in torch, which no other data command needs
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    paths = _check_inputs(inputs)
    tok = encoding_tokenizer(tokenizer, spec, megatron_version)
    encoding = _usable_encoding(tok, append_eod=append_eod, add_bos=add_bos)
    prefix = _checked_prefix(output_prefix)
    targets = [bin_path(prefix), idx_path(prefix), sidecar_path(prefix)]
    if workers < 1:
        raise DatasetError(f"--workers must be at least 1, got {workers}", fix="pass --workers 1 or more")
    out_dir, created = _output_dir(prefix, targets, paths, tok, force)
    tag = f".{Path(prefix).name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp_prefix = str(out_dir / tag)
    tmp_files = [bin_path(tmp_prefix), idx_path(tmp_prefix), sidecar_path(tmp_prefix)]

    # Megatron's rule on the vocabulary size its tokenizer reports (len(tokenizer) for HF)
    dtype = DType.optimal_dtype(encoding.vocab_size)
    if np.dtype(dtype) != optimal_dtype(encoding.vocab_size):  # our reader and megatron-core must agree
        raise LongctxError(f"dtype rule mismatch for vocab {encoding.vocab_size}")
    job = _Job(str(tok.path), tok.spec, json_key, add_bos, append_eod)
    stack_outer = contextlib.ExitStack()
    try:
        stack_outer.enter_context(_terminate_raises())
        builder = IndexedDatasetBuilder(str(bin_path(tmp_prefix)), dtype=dtype)
        stats = _tokenize_inputs(paths, builder, job, workers, progress, tok)
        sidecar = _sidecar(tok, job, np.dtype(dtype), stats, megatron_version)
        if not sidecar.tokens:
            # nothing to train on: refused now rather than when a stage first samples from it
            raise DatasetError(
                "the inputs hold no tokens",
                where=", ".join(str(p) for p in paths),
                fix=f"check the files and their {json_key!r} field (blank lines and empty texts are skipped)",
            )
        builder.finalize(str(idx_path(tmp_prefix)))
        write_sidecar(tmp_prefix, sidecar, path=sidecar_path(tmp_prefix))
        _publish(tmp_files, targets, out_dir)
        return sidecar
    except BaseException as err:
        for tmp in tmp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        if created is not None:  # directories this call made, now empty again
            shutil.rmtree(created, ignore_errors=True)
        if isinstance(err, OSError):
            raise DatasetError(
                f"cannot write the dataset: {err.strerror or err}",
                where=str(err.filename or prefix),
                fix="free space on that filesystem or choose another --output-prefix; nothing was written",
            ) from None
        raise
    finally:
        stack_outer.close()


def encoding_tokenizer(
    tokenizer: LoadedTokenizer | str | os.PathLike[str],
    spec: EncodingSpec | str | None,
    megatron_version: str | None,
) -> LoadedTokenizer:
    """The tokenizer encoding as `spec` says (default: its own type's). With a Megatron-LM release and no
    spec, as that release's defaults for the tokenizer's type (`version_spec`); a given spec must be one
    the release can be asked for (`version_flags`, TokenizerError otherwise)."""
    if isinstance(tokenizer, LoadedTokenizer):
        tok = tokenizer.with_spec(spec) if spec is not None else tokenizer
    else:
        tok = load_tokenizer(tokenizer, spec=spec)
    if megatron_version is None:
        return tok
    if spec is None:
        tok = tok.with_spec(version_spec(tok.spec.tokenizer_type, megatron_version))
    version_flags(tok.spec, megatron_version)
    return tok


def _checked_prefix(output_prefix: str | os.PathLike[str]) -> str:
    """The output prefix as a string; refused when it names no file (PREFIX.bin needs a stem)."""
    prefix = os.fspath(output_prefix)
    if not prefix or prefix.endswith(("/", os.sep)) or Path(prefix).name in ("", ".", ".."):
        raise DatasetError(
            f"--output-prefix {prefix!r} names no file: the dataset is written as PREFIX.bin and PREFIX.idx",
            where="--output-prefix",
            fix="give a directory and a file stem, e.g. data/corpus_text_document",
        )
    return prefix


def _sidecar(
    tok: LoadedTokenizer, job: _Job, dtype: np.dtype, stats: list[_InputStats], megatron_version: str | None
) -> DatasetSidecar:
    """What the sidecar records of a finished tokenization: tokenizer, options, release, counts, inputs."""
    return DatasetSidecar(
        origin="tokenize",
        longctx_version=__version__,
        tokenizer=SidecarTokenizer.of(tok),
        dtype=dtype.name,
        documents=sum(s.documents for s in stats),
        sequences=sum(s.sequences for s in stats),
        tokens=sum(s.tokens for s in stats),
        append_eod=job.append_eod,
        add_bos=job.add_bos,
        json_key=job.json_key,
        megatron_version=megatron_version,
        megatron_flags=_preprocess_flags(tok, job, megatron_version),
        inputs=[s.record for s in stats],
    )


def _preprocess_flags(tok: LoadedTokenizer, job: _Job, version: str | None) -> list[str] | None:
    """`megatron_preprocess_flags` in the release's terms; None where no preprocess_data.py run gives the
    same files: BOS prepended, or GPT-2 files on a release without the legacy tokenizer that reads them."""
    if job.add_bos:
        return None
    if tok.spec.tokenizer_type == GPT2_TYPE and version is not None and not facts(version).legacy_tokenizer:
        return None
    return megatron_preprocess_flags(tok, json_key=job.json_key, append_eod=job.append_eod, version=version)


def _publish(tmp_files: list[Path], targets: list[Path], out_dir: Path) -> None:
    """Make the written temporaries the dataset: synced, then renamed in order."""
    for tmp in tmp_files[:2]:
        _fsync(tmp)
    # .bin first, .idx second: a prefix "exists" for Megatron only once both are there
    for tmp, final in zip(tmp_files, targets, strict=True):
        os.replace(tmp, final)
    fsync_dir(out_dir)


def _output_dir(
    prefix: str, targets: list[Path], inputs: list[Path], tok: LoadedTokenizer, force: bool
) -> tuple[Path, Path | None]:
    """The output directory (made here) and the topmost directory this call created (None: it existed).
    Refuses outputs inside the tokenizer, over an input, or over an earlier output without `force`."""
    refuse_write_into(Path(prefix), Path(tok.path), "--output-prefix")
    for t in targets:
        for src in inputs:
            if is_within(t, src):
                raise DatasetError(
                    f"output {t.name} would overwrite the input {src}",
                    where=prefix,
                    fix="choose an --output-prefix that names no input file",
                )
    existing = [t.name for t in targets if t.exists()]
    if existing and not force:
        raise DatasetError(
            f"output prefix exists: {', '.join(existing)}",
            where=prefix,
            fix="pass --force to overwrite it, or choose another --output-prefix",
        )
    out_dir = Path(prefix).parent
    created = next((d for d in reversed([out_dir, *out_dir.parents]) if not d.exists()), None)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise DatasetError(
            f"cannot create the output directory: {err.strerror}",
            where=str(err.filename or out_dir),
            fix="choose an --output-prefix in a writable directory",
        ) from None
    return out_dir, created


def _usable_encoding(tok: LoadedTokenizer, *, append_eod: bool, add_bos: bool) -> Any:
    """The tokenizer's encoding backend, after refusing what would make wrong data."""
    problems = tok.encoding_problems()
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise TokenizerError(
            f"the tokenizer's files disagree, no data written: {problems[0]}{more}",
            where=str(tok.path),
            fix="run `longctx tokenizer check PATH --manifest …` to see every problem; take the model and its "
            "HF files from the same release",
        )
    backend = tok.backend
    if append_eod and backend.eod_id is None:
        raise DatasetError(
            "the tokenizer has no EOD/EOS token to end documents with",
            where=str(tok.path),
            fix="pass --no-append-eod, or use a tokenizer with an EOS token",
        )
    if add_bos:
        if tok.bos_id is None:
            raise TokenizerError("this tokenizer has no BOS token", where=str(tok.path), fix="drop --add-bos")
        probe = tok.encoding_fingerprint().probe_ids
        if tok.spec.adds_special_tokens and probe and probe[0][:1] == [tok.bos_id]:
            raise DatasetError(
                f"--add-bos with {tok.spec.describe()}, which already starts every document with BOS",
                where=str(tok.path),
                fix="drop --add-bos (the tokenizer's own BOS is what Megatron writes)",
            )
    return backend


def megatron_preprocess_flags(
    tok: LoadedTokenizer, *, json_key: str = "text", append_eod: bool = True, version: str | None = None
) -> list[str]:
    """The `tools/preprocess_data.py` flags that encode as `tok` does (besides --input, --output-prefix
    and --workers); with `version`, in that Megatron-LM release's terms (`version_flags`)."""
    spec = tok.spec
    if spec.tokenizer_type == "GPT2BPETokenizer":
        files = ["--vocab-file", str(tok.path / "vocab.json"), "--merge-file", str(tok.path / "merges.txt")]
        # only the legacy GPT-2 tokenizer reads these files; the current one loads "gpt2" from the Hub
        spec = dataclasses.replace(spec, legacy=True)
    elif tok.spec.tokenizer_type in SP_TYPES and tok.path.is_dir():
        files = ["--tokenizer-model", str(tok.path / "tokenizer.model")]
    else:
        files = ["--tokenizer-model", str(tok.path)]
    return [
        *spec.megatron_flags(version),
        *files,
        "--json-keys",
        json_key,
        *(["--append-eod"] if append_eod else []),
    ]


@dataclasses.dataclass
class _InputStats:
    record: SidecarInput
    documents: int
    sequences: int
    tokens: int


def _tokenize_inputs(
    paths: list[Path],
    builder: IndexedDatasetBuilder,
    job: _Job,
    workers: int,
    progress: bool,
    tok: LoadedTokenizer,
) -> list[_InputStats]:
    """Encode every input in order into `builder`: in worker processes when `workers` > 1, else here."""
    stats: list[_InputStats] = []
    total = sum(p.stat().st_size for p in paths)
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            pool = stack.enter_context(_start_pool(workers, job))
        else:
            _init_worker(job, tok=tok)
        advance = (
            stack.enter_context(progress_bar("tokenize", total, unit="bytes"))
            if progress
            else (lambda n=1: None)
        )
        for path in paths:
            stats.append(_tokenize_input(path, builder, pool, workers, advance))
    return stats


def _tokenize_input(
    path: Path,
    builder: IndexedDatasetBuilder,
    pool: ProcessPoolExecutor | None,
    workers: int,
    advance: Callable[..., None],
) -> _InputStats:
    reader = _HashingReader(path)
    docs_in = blank_in = empty_in = seqs_in = tokens = 0
    try:
        batches = _batches(path, reader, advance)
        results = _ordered(pool, batches, 4 * workers) if pool else map(_encode_batch, batches)
        for result in _readable(results, path):
            if isinstance(result, dict):
                raise DatasetError(str(result["what"]), where=result["where"], fix=result["fix"])
            flat, seqs_per_doc, seq_lengths, blank = result
            blank_in += blank
            lengths = seq_lengths.tolist()
            pos = seq = 0
            for n_seqs in seqs_per_doc.tolist():
                doc_lengths = lengths[seq : seq + n_seqs]
                n = sum(doc_lengths)
                builder.add_document(flat[pos : pos + n], doc_lengths)
                pos += n
                seq += n_seqs
                empty_in += n_seqs == 0
            docs_in += len(seqs_per_doc)
            seqs_in += len(lengths)
            tokens += int(flat.size)
    finally:
        reader.close()
    record = SidecarInput(
        path=str(path.resolve()),
        bytes=path.stat().st_size,
        sha256=reader.sha.hexdigest(),
        documents=docs_in,
        skipped_empty=blank_in,
        empty_documents=empty_in,
    )
    return _InputStats(record, docs_in, seqs_in, tokens)


def _readable(results: Iterator[Any], path: Path) -> Iterator[Any]:
    """`results`, with a corrupt or cut-off gzip stream (read lazily, mid-loop) turned into a clear error."""
    try:
        yield from results
    except (EOFError, gzip.BadGzipFile, zlib.error) as err:
        raise DatasetError(
            f"cannot read {path.name}: the gzip stream is corrupt or truncated ({err})",
            where=str(path),
            fix="re-download or re-compress the file (gzip -t checks it); nothing was written",
        ) from None


@contextlib.contextmanager
def _terminate_raises() -> Iterator[None]:
    """Turn SIGTERM (e.g. Slurm cancelling the job) into KeyboardInterrupt so temp files get removed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    owner = os.getpid()

    def handler(signum: int, frame: Any) -> None:
        if os.getpid() != owner:  # a forked worker: die quietly, the parent cleans up
            os._exit(128 + signum)
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
