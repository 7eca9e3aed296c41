"""Parse the JSON side files of a Hugging Face tokenizer directory without `transformers`.

Added tokens can be declared in three places (`added_tokens.json`, `tokenizer_config.json`'s
`added_tokens_decoder`, `tokenizer.json`'s `added_tokens`); `len(tokenizer)` — and therefore
Megatron's vocabulary size — counts every distinct id among the model's pieces and all of them.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from longctx.errors import TokenizerError

SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json", "tokenizer.json")
NAMED_SPECIALS = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclasses.dataclass
class HfSideFiles:
    """What the JSON files of an HF tokenizer directory declare (ids as written, not yet checked)."""

    present: list[str]
    # content -> id, merged over all sources; conflicting declarations are listed in `conflicts`
    added_tokens: dict[str, int]
    # "bos_token" -> "<bos>" from tokenizer_config.json, overridden by special_tokens_map.json
    named_specials: dict[str, str]
    additional_special_tokens: list[str]
    tokenizer_class: str | None
    add_bos_token: bool | None
    add_eos_token: bool | None
    conflicts: list[str]


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise TokenizerError(
            f"{path.name} nests too deeply to be a tokenizer file",
            where=str(path),
            fix="restore the file from the original tokenizer directory",
        ) from None
    except json.JSONDecodeError as err:
        raise TokenizerError(
            f"malformed JSON in {path.name}: {err.msg} at line {err.lineno} column {err.colno}",
            where=str(path),
            fix="restore the file from the original tokenizer directory",
        ) from None
    except UnicodeDecodeError:
        raise TokenizerError(
            f"{path.name} is not UTF-8 text",
            where=str(path),
            fix="restore the file from the original tokenizer",
        ) from None


def _token_content(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def read_side_files(directory: Path) -> HfSideFiles:
    present = [name for name in SIDE_FILES if (directory / name).is_file()]
    declared: list[tuple[str, int, str]] = []  # (content, id, source)
    named: dict[str, str] = {}
    additional: list[str] = []
    tokenizer_class = None
    add_bos = add_eos = None

    if "added_tokens.json" in present:
        declared += _added_tokens_json(directory / "added_tokens.json")
    if "tokenizer_config.json" in present:
        cfg = read_json(directory / "tokenizer_config.json")
        if not isinstance(cfg, dict):
            raise TokenizerError(
                "tokenizer_config.json is not a JSON object",
                where=str(directory / "tokenizer_config.json"),
                fix="restore the file from the tokenizer's release",
            )
        declared += _added_tokens_decoder(cfg, directory / "tokenizer_config.json")
        _read_specials(cfg, named, additional)
        tokenizer_class = cfg.get("tokenizer_class") if isinstance(cfg.get("tokenizer_class"), str) else None
        add_bos = cfg.get("add_bos_token") if isinstance(cfg.get("add_bos_token"), bool) else None
        add_eos = cfg.get("add_eos_token") if isinstance(cfg.get("add_eos_token"), bool) else None
    if "special_tokens_map.json" in present:
        smap = read_json(directory / "special_tokens_map.json")
        if not isinstance(smap, dict):
            raise TokenizerError(
                "special_tokens_map.json is not a JSON object",
                where=str(directory / "special_tokens_map.json"),
                fix="restore the file from the tokenizer's release",
            )
        _read_specials(smap, named, additional)  # overrides tokenizer_config.json's named specials
    if "tokenizer.json" in present:
        declared += _tokenizer_json_added(directory / "tokenizer.json")

    added, conflicts = _merge_declared(declared)
    return HfSideFiles(
        present=present,
        added_tokens=added,
        named_specials=named,
        additional_special_tokens=additional,
        tokenizer_class=tokenizer_class,
        add_bos_token=add_bos,
        add_eos_token=add_eos,
        conflicts=conflicts,
    )


def _added_tokens_json(path: Path) -> list[tuple[str, int, str]]:
    data = read_json(path)
    if not isinstance(data, dict):
        raise TokenizerError(
            "added_tokens.json is not a JSON object",
            where=str(path),
            fix='it maps each added token to its id: {"<pad>": 512}',
        )
    out = []
    for content, idx in data.items():
        if isinstance(idx, bool) or not isinstance(idx, int):
            raise TokenizerError(
                f"added_tokens.json maps {content!r} to a non-integer id {idx!r}",
                where=str(path),
                fix="give every added token an integer id (as the tokenizer was saved)",
            )
        check_token_id(content, idx, path)
        out.append((content, idx, "added_tokens.json"))
    return out


# ids index embedding rows: Megatron's vocabularies stay far below 2^31
MAX_TOKEN_ID = 2**31 - 1


def check_token_id(content: str, idx: int, path: Path) -> None:
    if not 0 <= idx <= MAX_TOKEN_ID:
        raise TokenizerError(
            f"{path.name} gives {content!r} the id {idx}, outside 0…{MAX_TOKEN_ID:,}",
            where=str(path),
            fix="restore the file from the tokenizer's release: ids are row numbers of the embedding",
        )


def _added_tokens_decoder(cfg: dict[str, Any], path: Path) -> list[tuple[str, int, str]]:
    out = []
    for sid, entry in (cfg.get("added_tokens_decoder") or {}).items():
        content = _token_content(entry)
        try:
            idx = int(sid)
        except ValueError:
            idx = -1
        if content is None or idx < 0:
            raise TokenizerError(
                f"tokenizer_config.json added_tokens_decoder has a malformed entry {sid!r}",
                where=str(path),
                fix="restore the file from the tokenizer's release",
            )
        check_token_id(content, idx, path)
        out.append((content, idx, "tokenizer_config.json"))
    return out


def _read_specials(data: dict[str, Any], named: dict[str, str], additional: list[str]) -> None:
    """Named specials (later files override) and additional special tokens (first mention kept)."""
    for key in NAMED_SPECIALS:
        content = _token_content(data.get(key))
        if content is not None:
            named[key] = content
    for tok in data.get("additional_special_tokens") or []:
        content = _token_content(tok)
        if content is not None and content not in additional:
            additional.append(content)


def _tokenizer_json_added(path: Path) -> list[tuple[str, int, str]]:
    tj = read_json(path)
    out = []
    for entry in (tj.get("added_tokens") or []) if isinstance(tj, dict) else []:
        content = _token_content(entry)
        idx = entry.get("id") if isinstance(entry, dict) else None
        if content is not None and isinstance(idx, int) and not isinstance(idx, bool):
            check_token_id(content, idx, path)
        if content is None or not isinstance(idx, int):
            raise TokenizerError("tokenizer.json has a malformed added_tokens entry", where=str(path))
        out.append((content, idx, "tokenizer.json"))
    return out


def _merge_declared(declared: list[tuple[str, int, str]]) -> tuple[dict[str, int], list[str]]:
    """content -> id over all sources, first declaration kept; contradicting ones listed as conflicts."""
    added: dict[str, int] = {}
    source_of: dict[str, str] = {}
    by_id: dict[int, tuple[str, str]] = {}
    conflicts: list[str] = []
    for content, idx, source in declared:
        if content in added and added[content] != idx:
            conflicts.append(
                f"{content!r} is id {added[content]} in {source_of[content]} but id {idx} in {source}"
            )
            continue
        if idx in by_id and by_id[idx][0] != content:
            conflicts.append(f"id {idx} is {by_id[idx][0]!r} in {by_id[idx][1]} but {content!r} in {source}")
            continue
        added[content] = idx
        source_of[content] = source
        by_id[idx] = (content, source)
    return added, conflicts
