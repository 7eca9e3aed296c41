"""Give a dataset made elsewhere (e.g. by Megatron's preprocess_data.py) a sidecar.

The sidecar records the tokenizer the user vouches for, with the encoding fingerprint of the
Megatron tokenizer type (and options) the data was made with; it is written only after a full check
with that tokenizer passes (ids in range, documents end in EOD), so it cannot bless data that
visibly does not fit the tokenizer.
"""

from __future__ import annotations

import os

from longctx import __version__
from longctx.data.check import TokenizerArg, check_datasets
from longctx.data.indexed import read_index
from longctx.data.sidecar import DatasetSidecar, SidecarTokenizer, sidecar_path, write_sidecar
from longctx.errors import DatasetError
from longctx.tokenizer import EncodingSpec, LoadedTokenizer, load_tokenizer


def fingerprint_dataset(
    prefix: str | os.PathLike[str],
    tokenizer: TokenizerArg,
    *,
    force: bool = False,
    workers: int | None = None,
    progress: bool = True,
    spec: EncodingSpec | str | None = None,
) -> DatasetSidecar:
    """`spec`: the Megatron tokenizer type and options the data was made with (default: the layout's)."""
    prefix = os.fspath(prefix)
    if isinstance(tokenizer, LoadedTokenizer):
        tok = tokenizer.with_spec(spec) if spec is not None else tokenizer
    else:
        tok = load_tokenizer(tokenizer, spec=spec)
    target = sidecar_path(prefix)
    if target.exists() and not force:
        raise DatasetError(
            f"sidecar exists: {target.name}", where=str(target), fix="pass --force to replace it"
        )
    report = check_datasets([prefix], tokenizer=tok, workers=workers, progress=progress)
    errors = [f for f in report.all_findings().errors if not (force and f.code.startswith("sidecar"))]
    if errors:
        first = errors[0]
        more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
        raise DatasetError(
            f"dataset does not fit the tokenizer, no sidecar written: {first.message}{more}",
            where=first.where or prefix,
            fix="run `longctx data check PREFIX --tokenizer PATH` for every error",
        )
    info = read_index(prefix)
    sidecar = DatasetSidecar(
        origin="fingerprint",
        longctx_version=__version__,
        tokenizer=SidecarTokenizer.of(tok),
        dtype=info.dtype.name,
        documents=info.documents,
        sequences=info.sequence_count,
        tokens=info.tokens,
        append_eod=True,
        add_bos=False,
        json_key=None,
        inputs=[],
    )
    write_sidecar(prefix, sidecar)
    return sidecar
