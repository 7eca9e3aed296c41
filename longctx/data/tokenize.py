"""`data tokenize`: JSONL → Megatron `.bin/.idx` with megatron-core's own builder, plus a sidecar.

One document per JSON line (field `text` by default), EOD appended to every document, token dtype
chosen by vocabulary size as Megatron's tools do. Worker processes parse and encode batches of lines;
the main process reads the inputs (hashing them on the way) and writes documents in input order.
Output appears atomically: everything is written under temporary names beside the prefix and
renamed at the end, so a failure leaves no half-written prefix behind.
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
import signal
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from longctx import __version__
from longctx.data.indexed import bin_path, idx_path, optimal_dtype
from longctx.data.sidecar import DatasetSidecar, SidecarInput, SidecarTokenizer, sidecar_path, write_sidecar
from longctx.errors import DatasetError, LongctxError
from longctx.tokenizer import LoadedTokenizer, load_tokenizer
from longctx.util.fs import fsync_dir
from longctx.util.progress import progress_bar

if TYPE_CHECKING:  # megatron-core pulls in torch; tokenize_jsonl imports it when it runs
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

BATCH_LINES = 256
BATCH_BYTES = 4 * 1024 * 1024

# -- worker side ---------------------------------------------------------------------------------------
_worker: dict[str, Any] = {}


def _init_worker(tokenizer_path: str, json_key: str, add_bos: bool, in_pool: bool = False) -> None:
    if in_pool:  # one thread per worker process; in-process encoding keeps the library's own threads
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker["tok"] = load_tokenizer(tokenizer_path)
    _worker["key"] = json_key
    _worker["add_bos"] = add_bos


def _encode_batch_safe(
    batch: tuple[str, int, list[bytes]],
) -> tuple[np.ndarray, np.ndarray, int] | dict[str, Any]:
    """Like `_encode_batch`, but hands errors back as data (exceptions lose where/fix when pickled)."""
    try:
        return _encode_batch(batch)
    except LongctxError as err:
        return err.to_dict()


def _encode_batch(batch: tuple[str, int, list[bytes]]) -> tuple[np.ndarray, np.ndarray, int]:
    """(flat token ids incl. EOD, per-document lengths, skipped empty documents) for a batch of lines."""
    source, first_line, lines = batch
    tok, key, add_bos = _worker["tok"], _worker["key"], _worker["add_bos"]
    texts: list[str] = []
    skipped = 0
    for offset, raw in enumerate(lines):
        lineno = first_line + offset
        if not raw.strip():
            skipped += 1
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise DatasetError(
                f"line {lineno} is not valid JSON ({err})",
                where=f"{source}:{lineno}",
                fix="every line of a JSONL input must be one JSON object",
            ) from None
        if not isinstance(obj, dict) or key not in obj:
            raise DatasetError(
                f"line {lineno} has no {key!r} field",
                where=f"{source}:{lineno}",
                fix=f"choose the text field with --json-key (found: {', '.join(map(str, obj)) if isinstance(obj, dict) else type(obj).__name__})",
            )
        text = obj[key]
        if not isinstance(text, str):
            raise DatasetError(
                f"line {lineno}: field {key!r} is {type(text).__name__}, not text", where=f"{source}:{lineno}"
            )
        if not text:
            skipped += 1
            continue
        texts.append(text)
    encoded = tok.encode_batch(texts, add_bos=add_bos) if texts else []
    eod = tok.eod_id
    lengths = np.fromiter((len(ids) + 1 for ids in encoded), dtype=np.int64, count=len(encoded))
    flat = np.empty(int(lengths.sum()), dtype=np.int64)
    pos = 0
    for ids in encoded:
        n = len(ids)
        flat[pos : pos + n] = ids
        flat[pos + n] = eod
        pos += n + 1
    return flat, lengths, skipped


# -- main side -----------------------------------------------------------------------------------------
class _HashingReader:
    """Binary reader over a (possibly gzipped) file that hashes and counts the raw bytes it reads."""

    def __init__(self, path: Path) -> None:
        self.raw = open(path, "rb")  # noqa: SIM115  # closed in close()
        self.sha = hashlib.sha256()
        self._hashing = _Tee(self.raw, self.sha)
        self.stream: IO[bytes] = (
            gzip.GzipFile(fileobj=self._hashing) if path.suffix == ".gz" else self._hashing
        )  # type: ignore[assignment]

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
    for lineno, line in enumerate(reader.stream, start=1):
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


def _start_pool(workers: int, tokenizer_path: str, json_key: str, add_bos: bool) -> ProcessPoolExecutor:
    # fork where available: no re-import of __main__ (works from notebooks and stdin scripts); workers
    # start here, before the progress thread exists, and touch only the tokenizer
    method = "fork" if "fork" in mp.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=mp.get_context(method),
        initializer=_init_worker,
        initargs=(tokenizer_path, json_key, add_bos, True),
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
    progress: bool = True,
) -> DatasetSidecar:
    """Tokenize JSONL files into `output_prefix.{bin,idx}` + `output_prefix.longctx.json`; returns the sidecar.

    `tokenizer` is a path or a `LoadedTokenizer`. Refuses an existing prefix unless `force`.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
        # lazy: megatron-core pulls in torch, which no other data command needs
        from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    paths = _check_inputs(inputs)
    tok = tokenizer if isinstance(tokenizer, LoadedTokenizer) else load_tokenizer(tokenizer)
    if tok.eod_id is None:
        raise DatasetError("the tokenizer has no EOD/EOS token to end documents with", where=str(tok.path))
    prefix = os.fspath(output_prefix)
    targets = [bin_path(prefix), idx_path(prefix), sidecar_path(prefix)]
    existing = [t.name for t in targets if t.exists()]
    if existing and not force:
        raise DatasetError(
            f"output prefix exists: {', '.join(existing)}",
            where=prefix,
            fix="pass --force to overwrite it, or choose another --output-prefix",
        )
    if workers < 1:
        raise DatasetError(f"--workers must be at least 1, got {workers}")
    out_dir = Path(prefix).parent
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f".{Path(prefix).name}.{uuid.uuid4().hex[:8]}.tmp"
    tmp_prefix = str(out_dir / tag)
    tmp_files = [bin_path(tmp_prefix), idx_path(tmp_prefix), sidecar_path(tmp_prefix)]

    dtype = DType.optimal_dtype(tok.vocab_size)
    if np.dtype(dtype) != optimal_dtype(tok.vocab_size):  # our reader and megatron-core must agree
        raise LongctxError(f"dtype rule mismatch for vocab {tok.vocab_size}")
    stack_outer = contextlib.ExitStack()
    try:
        stack_outer.enter_context(_terminate_raises())
        builder = IndexedDatasetBuilder(str(bin_path(tmp_prefix)), dtype=dtype)
        stats = _tokenize_inputs(paths, builder, str(tok.path), json_key, add_bos, workers, progress)
        builder.finalize(str(idx_path(tmp_prefix)))
        documents = sum(s.documents for s in stats)
        sidecar = DatasetSidecar(
            origin="tokenize",
            longctx_version=__version__,
            tokenizer=SidecarTokenizer.of(tok),
            dtype=np.dtype(dtype).name,
            documents=documents,
            sequences=documents,
            tokens=sum(s.tokens for s in stats),
            append_eod=True,
            add_bos=add_bos,
            json_key=json_key,
            inputs=[s.record for s in stats],
        )
        write_sidecar(tmp_prefix, sidecar, path=sidecar_path(tmp_prefix))
        for tmp in tmp_files[:2]:
            _fsync(tmp)
        # .bin first, .idx second: a prefix "exists" for Megatron only once both are there
        for tmp, final in zip(tmp_files, targets, strict=True):
            os.replace(tmp, final)
        fsync_dir(out_dir)
        return sidecar
    except BaseException:
        for tmp in tmp_files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    finally:
        stack_outer.close()


@dataclasses.dataclass
class _InputStats:
    record: SidecarInput
    documents: int
    tokens: int


def _tokenize_inputs(
    paths: list[Path],
    builder: IndexedDatasetBuilder,
    tokenizer_path: str,
    json_key: str,
    add_bos: bool,
    workers: int,
    progress: bool,
) -> list[_InputStats]:
    """Encode every input in order into `builder`: in worker processes when `workers` > 1, else here."""
    stats: list[_InputStats] = []
    total = sum(p.stat().st_size for p in paths)
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            pool = stack.enter_context(_start_pool(workers, tokenizer_path, json_key, add_bos))
        else:
            _init_worker(tokenizer_path, json_key, add_bos)
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
    docs_in = skipped_in = tokens = 0
    try:
        batches = _batches(path, reader, advance)
        results = _ordered(pool, batches, 4 * workers) if pool else map(_encode_batch, batches)
        for result in results:
            if isinstance(result, dict):
                raise DatasetError(str(result["what"]), where=result["where"], fix=result["fix"])
            flat, lengths, skipped = result
            skipped_in += skipped
            pos = 0
            for n in lengths.tolist():
                builder.add_document(flat[pos : pos + n], [n])
                pos += n
            docs_in += len(lengths)
            tokens += int(flat.size)
    finally:
        reader.close()
    record = SidecarInput(
        path=str(path.resolve()),
        bytes=path.stat().st_size,
        sha256=reader.sha.hexdigest(),
        documents=docs_in,
        skipped_empty=skipped_in,
    )
    return _InputStats(record, docs_in, tokens)


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
