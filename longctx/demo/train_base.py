"""`longctx demo --train-base [--family mdm]`: rebuild a published demo base from its seeded corpus.

The base is pretrained once, in the background, and published in the package (`longctx.demo.published`);
the demo adopts it as a user adopts a downloaded base. Steps (each kept when its output exists, so a rerun
after a kill resumes — the trainer itself resumes from its last save):
 1. tokenizer — SentencePiece, OpenEuroLLM special-token layout, digits as single pieces, + manifest
                (the masked-diffusion base takes the autoregressive base's, and its weights to adapt);
 2. phases    — the recipe's phases in order (`Phase`), each in its own directory of the work dir:
                corpus (seeded pass-key documents, `longctx.demo.corpus`, sized for the base window),
                data (Megatron .bin/.idx) and training with longctx's local trainer (megatron-core GPT,
                documents packing, saving every few hundred iterations), from the weights the phase
                before left;
 3. measure   — greedy exact match of the needle tasks (single, multi-key), keys of any digits, at the
                base length and beyond (extrapolated);
 4. publish   — a model-only torch_dist save as a tar (the MDM in Ermine's predecessor layout), the
                tokenizer, card.toml and MODEL_CARD.md.
The recipe is fixed here so the command takes no knobs: the card records what it did and how long it took.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import shutil
import tarfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import tomli_w
import torch

from longctx.arch import ModelArch
from longctx.checkpoint.inspect import inspect_checkpoint
from longctx.checkpoint.save_layout import read_tracker
from longctx.data.tokenize import tokenize_jsonl
from longctx.demo.adapt import adapt_to_diffusion
from longctx.demo.corpus import documents, write_jsonl
from longctx.demo.published import (
    ARCHIVE,
    CARD,
    TOKENIZER_DIR,
    TOKENIZER_MANIFEST,
    Card,
    Retrieval,
    family_dir,
    install_published,
    read_card,
)
from longctx.demo.train_launch import reached, train_to_target
from longctx.errors import LongctxError, StageError
from longctx.eval.data import HeldOut
from longctx.eval.engine import CheckpointRef, evaluate_checkpoints
from longctx.eval.load import checkpoint_info, load_model
from longctx.eval.settings import EvalSettings
from longctx.mcore.checkpoint import save_checkpoint
from longctx.mcore.parallel import eval_parallel
from longctx.mcore.stored_layout import BUFFER_PREFIX, StoredLayout
from longctx.objective import Objective
from longctx.stage.lock import run_lock
from longctx.tokenizer import fingerprint, load_manifest, load_tokenizer, train_sentencepiece, write_manifest
from longctx.train.spec import LRSchedule, TokenizerInfo, TrainSpec
from longctx.util.confined_read import read_text
from longctx.util.fs import atomic_write_text
from longctx.util.hashing import md5_file
from longctx.util.machine import cpu_model
from longctx.util.shipped import resource_dir

Echo = Callable[[str], None]
# tokenizer.json and the HF side files; the manifest travels beside the directory
_TOKENIZER_FILES = ("tokenizer.model", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                    "added_tokens.json")  # fmt: skip


# two layers are the fewest that hold an induction (copy) circuit; 173K parameters besides the embeddings
BASE_ARCH = ModelArch(
    num_layers=2,
    hidden_size=64,
    ffn_hidden_size=192,
    num_attention_heads=2,
    num_query_groups=2,
    kv_channels=32,
    qk_layernorm=True,
    untie_embeddings_and_output_weights=True,
)


@dataclasses.dataclass(frozen=True)
class Phase:
    """One corpus of the base and how long the base trains on it; a phase starts from the weights the
    phase before it left (the first: random weights, or the adapted source's)."""

    name: str
    docs: int
    iterations: int
    seed: int
    names: int = 1  # the most named keys in a document (`longctx.demo.corpus.document`)
    any_digit: float = 0.0  # the share of keys drawn with repeated digits allowed
    # the rate decays over the phase (cosine, to a tenth): settles what a phase at the constant rate
    # left swinging from save to save
    anneal: bool = False


# A copy circuit first, then lookup by name (the corpus module says why this order): one key per
# document with distinct digits until the base copies a key keyed on "is" (20M tokens), then one to
# four named keys per document, half of them of any digits, until it matches the name and copies keys
# with repeated digits (measured from the copy phase's weights: 94 % and 96 % of 2- and 4-name
# haystacks after 4M tokens, where the copying base answered 32 % and 16 %)
AR_PHASES = (
    Phase("copy", docs=136_000, iterations=5000, seed=1),
    Phase("lookup", docs=120_000, iterations=3000, seed=21, names=4, any_digit=0.5),
)


@dataclasses.dataclass(frozen=True)
class BaseRecipe:
    """How a published demo base is made (what its card records); `RECIPES` holds one per family."""

    name: str = "longctx-demo-ar-base"
    family: str = "ar"
    objective: Objective = dataclasses.field(default_factory=Objective)
    vocab_size: int = 512
    padded_vocab_size: int = 640
    output_vocab_size: int | None = None  # output-layer rows when not padded_vocab_size (the MDM)
    arch: ModelArch = BASE_ARCH
    # the published base (family) this one starts from, its tokenizer and weights (`longctx.demo.adapt`);
    # None: a tokenizer of its own and random weights
    adapt_from: str | None = None
    seq_length: int = 256
    rotary_base: int = 10_000
    phases: tuple[Phase, ...] = AR_PHASES
    heldout_docs: int = 400  # per phase's corpus
    # documents of 8 to 17 sentences (≈ 110 to 240 tokens): a statement and its restatements share a window
    min_words: int = 80
    max_words: int = 170
    global_batch: int = 16
    lr: float = 2e-3  # constant after warmup: the copy circuit forms late, a decayed rate stalls it
    warmup: int = 100
    save_interval: int = 500
    processes: int = 2
    eval_keys: int = 20  # per length and depth
    # what the card measures; each of bar_tasks (None: every one) must reach publish_bar at the base's window
    eval_tasks: tuple[str, ...] = ("single", "multikey-2", "multikey-4")
    bar_tasks: tuple[str, ...] | None = None
    eval_any_digit: bool = True  # keys of any digits (repeats allowed), or of distinct digits
    # the lengths the card measures: the base's window (the bar is read there) and beyond it, extrapolated
    eval_lengths: tuple[int, ...] = (256, 1024, 4096)
    publish_bar: float = 0.9  # greedy exact match at its own window a published base must reach

    @property
    def iterations(self) -> int:
        return sum(p.iterations for p in self.phases)


# The masked-diffusion base: the autoregressive base adapted to the MDM objective (its weights, its
# tokenizer, the same corpus and packing; `longctx.demo.adapt` says why), built as Ermine's predecessor
# builds its MDMs (unpadded: the input embedding is the tokenizer's 513 ids + the [MASK] row, the output
# layer the 513 ids) and published in that code base's layout (`publish`).
RECIPES = {
    "ar": BaseRecipe(),
    # the MDM learns lookup by name from the AR base's weights on the named-key corpus; decoded as MDMs
    # are (`longctx.eval.unmask`, most confident digit first) it looks keys up where one forward for all
    # digits at once cannot (docs/demo.md has the figures of both)
    "mdm": BaseRecipe(
        name="longctx-demo-mdm-base",
        family="mdm",
        objective=Objective(kind="mdm", mask_id=513),
        padded_vocab_size=514,
        output_vocab_size=513,
        adapt_from="ar",
        phases=(
            Phase("lookup", docs=136_000, iterations=8000, seed=21, names=4, any_digit=0.5),
            Phase("anneal", docs=40_000, iterations=2000, seed=22, names=4, any_digit=0.5, anneal=True),
        ),
    ),
}
# The uniform-state base: the published MDM adapted to the UDM objective (its weights, bidirectional
# already, less the [MASK] row; its tokenizer), on the MDM's named-key corpora. Adapted from the AR base
# instead, UDMs of 2 and 3 layers copied single keys but hardly matched names (docs/demo.md); from the
# MDM the lookup by name is there to keep. Published on its single needles: the card states the 2- and
# 4-name figures it reaches, whatever they are
RECIPES["udm"] = dataclasses.replace(
    RECIPES["mdm"],
    name="longctx-demo-udm-base",
    family="udm",
    objective=Objective(kind="udm"),
    padded_vocab_size=513,
    output_vocab_size=None,
    adapt_from="mdm",
    phases=(
        Phase("lookup", docs=136_000, iterations=3000, seed=21, names=4, any_digit=0.5),
        Phase("anneal", docs=40_000, iterations=1000, seed=22, names=4, any_digit=0.5, anneal=True),
    ),
    bar_tasks=("single",),
)


def recipe_for(family: str) -> BaseRecipe:
    """The recipe of `family`'s published base; an error naming the families that have one."""
    if family not in RECIPES:
        raise StageError(
            f"no published demo base for the {family!r} family",
            where="--family",
            fix=f"--train-base builds one of: {', '.join(RECIPES)}",
        )
    return RECIPES[family]


def _tokenizer(work: Path, r: BaseRecipe) -> str:
    tok_dir = work / "tokenizer"
    if (tok_dir / "manifest.toml").exists():
        return f"{tok_dir} (kept)"
    if r.adapt_from is not None:  # the adapted model keeps its source's tokenizer, checked against its card
        card, _ = install_published(family_dir(r.adapt_from), tok_dir, work / "source")
        return f"{card.name}'s tokenizer (md5 {card.tokenizer_md5}) and weights, checked against its card"
    sample = list(documents(400, seed=7, min_words=r.min_words, max_words=r.max_words))
    train_sentencepiece(sample, tok_dir, r.vocab_size, layout="oellm", hf=True, tokenizer_json=True)
    # the manifest is published: it describes the tokenizer, not the directory it was built in
    m = fingerprint(tok_dir, name=f"{r.name}-tokenizer").model_copy(
        update={"description": f"SentencePiece BPE, vocab {r.vocab_size}, of the seeded demo corpus"}
    )
    write_manifest(
        m, tok_dir / "manifest.toml", header=f"The tokenizer of {r.name} (`longctx demo --train-base`)."
    )
    return f"SentencePiece vocab {m.vocab_size}, md5 {m.md5}"


def _phase_dir(work: Path, phase: Phase) -> Path:
    """Where a phase keeps its corpus, data, checkpoints, log and metrics."""
    return work / phase.name


def _prefix(work: Path, phase: Phase) -> Path:
    return _phase_dir(work, phase) / "data" / f"{phase.name}_text_document"


def final_save(work: Path, r: BaseRecipe) -> Path:
    """The save dir of the last phase: the base that is measured and published."""
    return _phase_dir(work, r.phases[-1]) / "checkpoints"


def _data(work: Path, r: BaseRecipe, phase: Phase) -> str:
    prefix = _prefix(work, phase)
    if Path(f"{prefix}.idx").exists():
        return f"{prefix} (kept)"
    train = _phase_dir(work, phase) / "corpus" / "train.jsonl"
    docs = documents(
        phase.docs + r.heldout_docs,
        seed=phase.seed,
        min_words=r.min_words,
        max_words=r.max_words,
        names=phase.names,
        any_digit=phase.any_digit,
    )
    write_jsonl(train, docs)
    side = tokenize_jsonl([train], work / "tokenizer", prefix, workers=r.processes)
    return f"{side.documents:,} documents, {side.tokens:,} tokens"


def _split(r: BaseRecipe, phase: Phase) -> str:
    """Train on all but the last `heldout_docs` documents (in percent, as Megatron's --split)."""
    held = 100.0 * r.heldout_docs / (phase.docs + r.heldout_docs)
    return f"{100.0 - held:.4f},{held:.4f},0"


def _spec(work: Path, r: BaseRecipe, phase: Phase) -> TrainSpec:
    tok = load_tokenizer(work / "tokenizer")
    if r.objective.kind == "mdm" and (r.objective.mask_id, r.padded_vocab_size) != (
        tok.vocab_size,
        tok.vocab_size + 1,
    ):
        raise StageError(
            f"the recipe's [MASK] id {r.objective.mask_id} and {r.padded_vocab_size} input rows do not follow "
            f"its tokenizer's {tok.vocab_size} ids (the [MASK] row is the first past them)",
            where=str(work / "tokenizer"),
            fix="rebuild the work directory from the published tokenizer",
        )
    if r.objective.kind == "udm" and r.padded_vocab_size != tok.vocab_size:
        raise StageError(
            f"the recipe's {r.padded_vocab_size} vocabulary rows are not its tokenizer's {tok.vocab_size} ids (a "
            "uniform-state model is built unpadded: its noise is drawn from the tokenizer's ids)",
            where=str(work / "tokenizer"),
            fix="rebuild the work directory from the published tokenizer",
        )
    threads = max(1, (os.cpu_count() or 1) // r.processes)
    d, n = _phase_dir(work, phase), phase.iterations
    return TrainSpec(
        stage=f"base-{phase.name}",
        arch=r.arch,
        seq_length=r.seq_length,
        max_position_embeddings=r.seq_length,
        rotary_base=r.rotary_base,
        padded_vocab_size=r.padded_vocab_size,
        output_vocab_size=r.output_vocab_size,
        objective=r.objective,
        tokenizer=TokenizerInfo(
            path=str(work / "tokenizer"),
            md5=tok.md5,
            vocab_size=tok.vocab_size,
            eod_id=tok.eod_id,
            pad_id=tok.pad_id,
        ),
        data=[(None, str(_prefix(work, phase)))],
        split=_split(r, phase),
        packing="documents",
        data_cache_path=str(d / "cache"),
        global_batch_size=r.global_batch,
        train_iters=n,
        lr=LRSchedule(
            lr=r.lr,
            min_lr=r.lr * (0.1 if phase.anneal else 1.0),
            warmup_iters=r.warmup,
            decay_iters=n,
            decay_style="cosine" if phase.anneal else "constant",
        ),
        save=str(d / "checkpoints"),
        save_interval=r.save_interval,
        log_interval=50,
        threads_per_process=threads,
        metrics_file=str(d / "metrics.jsonl"),
        tensorboard_dir=str(d / "tensorboard"),
    )


def _start(work: Path, r: BaseRecipe, index: int) -> Path | None:
    """The weights phase `index` starts from: the phase before's last save, the adapted source's for
    the first phase of an adapted recipe, or none (random)."""
    if index > 0:
        return _phase_dir(work, r.phases[index - 1]) / "checkpoints"
    if r.adapt_from is None:
        return None
    if read_tracker(work / "init") is None:
        adapt_to_diffusion(
            work / "source",
            work / "init",
            kind=r.objective.kind,
            arch=r.arch,
            seq_length=r.seq_length,
            input_rows=r.padded_vocab_size,
            output_rows=r.output_vocab_size or r.padded_vocab_size,
        )
    return work / "init"


def _train(work: Path, r: BaseRecipe, index: int) -> str:
    """Train (or resume) phase `index` to its iterations. The launch's wall time is added to the work
    dir's total whatever its end (a stopped launch trained too, and a rerun goes on from its save)."""
    phase = r.phases[index]
    d = _phase_dir(work, phase)
    done = reached(d / "checkpoints")
    if done >= phase.iterations:
        return f"iteration {done} (kept)"
    spec = _spec(work, r, phase)
    start = _start(work, r, index)
    if start is not None:
        spec = spec.model_copy(update={"pretrained": str(start)})
    spec.dump(d / "train_spec.json")
    t0 = time.monotonic()
    try:
        # a launch asked to stop (SIGTERM, Ctrl-C) saves and exits 0: the phase is not done, and the next
        # phase must not start from its weights (`train_to_target` checks the save against the target)
        train_to_target(
            d / "train_spec.json",
            nproc=r.processes,
            env={"OMP_NUM_THREADS": str(spec.threads_per_process)},
            log=d / "train.log",
            save_dir=d / "checkpoints",
            target=phase.iterations,
            what=f"phase {phase.name}",
        )
    finally:
        _wall(work, time.monotonic() - t0)
    return f"{phase.iterations} iterations of {r.global_batch}×{r.seq_length} tokens"


def _wall(work: Path, seconds: float) -> float:
    """Training wall time summed over every launch (a resumed run adds up), kept in the work dir."""
    f = work / "train_wall_seconds.txt"
    total = (float(f.read_text()) if f.exists() else 0.0) + seconds
    atomic_write_text(f, f"{total:.1f}\n")
    return total


def measure(work: Path, r: BaseRecipe) -> list[Retrieval]:
    """Greedy exact match of each of the recipe's tasks at each of its `eval_lengths` (beyond the window
    by extrapolation), `eval_keys` per depth."""
    settings = EvalSettings(
        keys_per_cell=r.eval_keys,
        distractors=0,
        short_docs=0,
        packed_windows=0,
        loss_docs=1,
        tasks=list(r.eval_tasks),
        any_digit_keys=r.eval_any_digit,
    )
    last = r.phases[-1]
    report = evaluate_checkpoints(
        [CheckpointRef("base", final_save(work, r), allow_extrapolation=True)],
        lengths=list(r.eval_lengths),
        tokenizer=load_tokenizer(work / "tokenizer"),
        heldout=HeldOut([str(_prefix(work, last))], _split(r, last)),
        settings=settings,
        short_length=r.seq_length,
        cache_dir=work / "eval-cache",
    )
    rows: list[Retrieval] = []
    for res in sorted(report.checkpoints[0].results, key=lambda x: x.length):
        if "single" in r.eval_tasks:
            keys = sum(c.keys for c in res.passkey.cells)
            rows.append(Retrieval(length=res.length, keys=keys, exact=res.passkey.greedy_accuracy))
        rows += [Retrieval(task=t.task, length=res.length, keys=t.keys, exact=t.accuracy) for t in res.tasks]
    return rows


def _reproducible(ti: tarfile.TarInfo) -> tarfile.TarInfo:
    ti.mtime, ti.uid, ti.gid, ti.uname, ti.gname = 0, 0, 0, "", ""
    return ti


# what the diffusion entry script of Ermine's predecessor saves in its args: a diffusion model (target
# length 1), built unpadded; the MDM with the [MASK] subtokenizer
ERMINE_DIFFUSION_ARGS = dict(target_length=1, padded_input=0, padded_output=0)
ERMINE_MDM_ARGS = dict(ERMINE_DIFFUSION_ARGS, subtokenizer_type="mask", random_ratio=0.0)


def ermine_layout(vocab: int, mask_id: int | None) -> StoredLayout:
    """How Ermine's predecessor stores a diffusion model: the transformer under `encoder.`, and the
    subtokenizer's buffers — the id lookup table ([vocab, 1], int64, the identity for a model on its
    tokenizer's own ids) and, for a masked-diffusion model, the [MASK] id ([1], int64)."""
    buffers = {f"{BUFFER_PREFIX}lookup_table": torch.arange(vocab, dtype=torch.int64).reshape(vocab, 1)}
    if mask_id is not None:
        buffers[f"{BUFFER_PREFIX}mask"] = torch.tensor([mask_id], dtype=torch.int64)
    return StoredLayout(block="encoder", buffers=buffers)


def model_only_archive(save_dir: Path, out: Path, r: BaseRecipe) -> int:
    """Save the model of `save_dir`'s last checkpoint alone (no optimizer, no RNG) as torch_dist and pack
    it as a tar holding that save dir, as Ermine ships its bases; returns the iteration. A diffusion base
    is stored as Ermine's predecessor stores its diffusion models (`ermine_layout`, its args)."""
    info = checkpoint_info(save_dir)
    args = argparse.Namespace(**inspect_checkpoint(save_dir).args)
    staging = out.parent / f".{out.stem}.staging"
    shutil.rmtree(staging, ignore_errors=True)
    inner = staging / out.stem
    with eval_parallel(1) as par:
        loaded = load_model(info, par, max_length=info.seq_length or r.seq_length)
        model_state = None
        if r.objective.kind in ("mdm", "udm"):
            mdm = r.objective.kind == "mdm"
            if mdm and (r.objective.mask_id is None or r.output_vocab_size is None):
                raise StageError(f"the recipe {r.name} leaves its [MASK] id or output rows open")
            rows = r.output_vocab_size or r.padded_vocab_size
            model_state = ermine_layout(rows, r.objective.mask_id if mdm else None).model_state(
                loaded.model, buffers=True
            )
            # the args as that code base saves them: its own flags, none of longctx's trainer (the demo
            # then tells the family from the layout alone, as it must for a user's Ermine checkpoint)
            args = argparse.Namespace(
                **{k: v for k, v in vars(args).items() if not k.startswith("longctx_")},
                **(ERMINE_MDM_ARGS if mdm else ERMINE_DIFFUSION_ARGS),
            )
        # the tokenizer travels beside the archive: its saved path names that directory, not the build's
        args.tokenizer_model = TOKENIZER_DIR
        save_checkpoint(inner, info.iteration or 0, model=loaded.model, args=args, model_state=model_state)
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.add(inner, arcname=out.stem, filter=_reproducible)
    tmp.rename(out)
    shutil.rmtree(staging)
    return info.iteration or 0


def card_toml(card: Card) -> str:
    """card.toml: scalars, then [arch], then one [[retrieval]] table per length."""
    data = card.model_dump(exclude_none=True)
    return (
        "# The published demo base (longctx.demo.published); rebuilt by the command below.\n"
        + tomli_w.dumps(data)
    )


# what each family's card says the base is, and what its retrieval figures measure
_KIND = {
    "ar": ("A tiny autoregressive GPT", "Greedy exact match of the whole 5-digit key"),
    "mdm": (
        "A tiny masked-diffusion model, bidirectional, stored as Ermine's predecessor stores its MDMs (the\n"
        "layers under `encoder.`, the `subtokenizer.*` buffers, a [MASK] row in the input embedding)",
        "Passkey by infilling (the restatement closed as the needle's sentence, every digit of its key\n"
        "masked): greedy exact match of the whole 5-digit key, decoded one digit a round, most confident first",
    ),
    "udm": (
        "A tiny uniform-state diffusion model, bidirectional, stored as Ermine's predecessor stores its\n"
        "diffusion models (the layers under `encoder.`, the `subtokenizer.lookup_table` buffer; no [MASK])",
        "Passkey by infilling (the restatement closed as the needle's sentence, every digit of its key\n"
        "replaced by a uniformly drawn token): greedy exact match of the whole 5-digit key, decoded one\n"
        "digit a round, most confident first",
    ),
}


def _phases_line(r: BaseRecipe) -> str:
    """What the recipe trained on, phase by phase."""
    said = [
        f"{p.name}: {p.iterations:,} iterations on "
        + (
            "one pass key per document, of distinct digits"
            if p.names == 1
            else f"1 to {p.names} named keys per document, {100 * p.any_digit:.0f} % of them of any digits"
        )
        + (", the rate decaying to a tenth" if p.anneal else "")
        for p in r.phases
    ]
    return "the seeded demo corpus (filler sentences, pass keys restated later); " + "; then ".join(said)


def card_markdown(card: Card, r: BaseRecipe) -> str:
    a = card.arch
    what, metric = _KIND[card.family]
    rows = "\n".join(
        f"| {r.task} | {r.length:,} | {r.keys} | {100 * r.exact:.0f} % |" for r in card.retrieval
    )
    vocab = f"SentencePiece, {card.padded_vocab_size} input rows"
    if card.output_vocab_size is not None:
        vocab += f", {card.output_vocab_size} output rows"
    if card.mask_id is not None:
        vocab += f", [MASK] id {card.mask_id}"
    demo = "longctx demo" + ("" if card.family == "ar" else f" --family {card.family}")
    training = f"{r.iterations:,} iterations, {card.tokens:,} tokens, longctx's local trainer"
    if len(r.phases) > 1:
        training += f" ({len(r.phases)} phases; the archive's iteration {card.iteration:,} is the last one's)"
    if card.adapted_from is not None:
        training += (
            f", starting from the weights of `{card.adapted_from}` "
            f"({(r.adapt_from or '').upper()} → {card.family.upper()} adaptation)"
        )
    return f"""# {card.name}

{what}; megatron-core, torch_dist, model only.
`{demo}` adopts and extends it, as a user adopts a published base. Rebuild it with `{card.command}`.

| | |
|---|---|
| shape | {a.num_layers} layers, hidden {a.hidden_size}, {a.num_attention_heads} heads × {a.kv_channels}, \
SwiGLU {a.ffn_hidden_size}, RMSNorm, QK-norm, untied embeddings |
| window | {card.seq_length} tokens, RoPE base {card.rotary_base:,} |
| vocabulary | {vocab} (tokenizer md5 `{card.tokenizer_md5}`) |
| training | {training} |
| data | {_phases_line(r)} |
| wall time | {card.wall_seconds / 60:.0f} min on {card.machine} |
| archive | `{card.archive}`, md5 `{card.archive_md5}` |

{metric} (every depth together, keys of {"any" if r.eval_any_digit else "distinct"} digits; `single`: one needle in
the haystack, `multikey-K`: K needles under different names, the question names one; beyond
{card.seq_length} by extrapolation, which is what the extension stages fix):

| task | length | keys | exact match |
|---|---:|---:|---:|
{rows}
"""


def publish(work: Path, out_dir: Path, r: BaseRecipe, wall: float, retrieval: list[Retrieval]) -> Card:
    """Write the archive, the tokenizer, card.toml and MODEL_CARD.md into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    iteration = model_only_archive(final_save(work, r), out_dir / ARCHIVE, r)
    tok_out = out_dir / TOKENIZER_DIR
    shutil.rmtree(tok_out, ignore_errors=True)
    tok_out.mkdir()
    for name in _TOKENIZER_FILES:
        if (work / "tokenizer" / name).is_file():
            shutil.copyfile(work / "tokenizer" / name, tok_out / name)
    shutil.copyfile(work / "tokenizer" / "manifest.toml", out_dir / TOKENIZER_MANIFEST)
    card = Card(
        name=r.name,
        family=r.family,
        archive_md5=md5_file(out_dir / ARCHIVE),
        tokenizer_md5=load_manifest(out_dir / TOKENIZER_MANIFEST).md5,
        iteration=iteration,
        seq_length=r.seq_length,
        rotary_base=r.rotary_base,
        padded_vocab_size=r.padded_vocab_size,
        output_vocab_size=r.output_vocab_size,
        mask_id=r.objective.mask_id,
        arch=r.arch,
        tokens=r.iterations * r.global_batch * r.seq_length,
        wall_seconds=round(wall, 1),
        machine=f"{os.cpu_count()} CPU cores ({cpu_model()}, {platform.machine()})",
        adapted_from=None if r.adapt_from is None else read_card(family_dir(r.adapt_from)).name,
        command="longctx demo --train-base" + ("" if r.family == "ar" else f" --family {r.family}"),
        retrieval=retrieval,
    )
    atomic_write_text(out_dir / CARD, card_toml(card))
    atomic_write_text(out_dir / "MODEL_CARD.md", card_markdown(card, r))
    return card


@contextmanager
def _step(echo: Echo, name: str) -> Iterator[list[str]]:
    """Announce a step, let the block append its one-line result, print it with the step's time."""
    echo(f"==> {name}")
    t0 = time.monotonic()
    said: list[str] = []
    yield said
    echo(f"    {'; '.join(said)} [{time.monotonic() - t0:.1f} s]")


RECIPE_FILE = "recipe.json"
# what a rerun may change and still resume the same base: how far it trains, how it runs, what it measures
# and which of the measured tasks the bar reads
RESUMABLE = frozenset({"iterations", "save_interval", "processes", "eval_keys", "eval_lengths", "bar_tasks"})


def _record_value(v: object) -> object:
    if hasattr(v, "model_dump"):
        return v.model_dump(mode="json")
    if isinstance(v, tuple):
        return [_record_value(x) for x in v]
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {k: x for k, x in dataclasses.asdict(v).items() if k not in RESUMABLE}
    return v


def _recipe_record(r: BaseRecipe) -> dict[str, object]:
    """The recipe's identity: every field but those a rerun may change (RESUMABLE, a phase's too)."""
    return {
        f.name: _record_value(getattr(r, f.name)) for f in dataclasses.fields(r) if f.name not in RESUMABLE
    }


def claim_work_dir(work: Path, r: BaseRecipe) -> None:
    """The work directory is this recipe's: new or empty (then its recipe is recorded), or holding the
    record of the same recipe (a rerun resumes). Anything else is refused before anything is written:
    another run's checkpoint would be kept, measured and published as this base."""
    if work.resolve().is_relative_to(resource_dir().resolve()):
        raise StageError(
            "the work directory is inside the installed package",
            where=str(work),
            fix="give --dir a directory of your own (the base is published into the package)",
        )
    record = work / RECIPE_FILE
    want = _recipe_record(r)
    if record.is_file():
        try:
            text = read_text(record, work, "the recipe record", error=StageError, max_bytes=1 << 16)
            have = json.loads(text or "null")
        except (LongctxError, ValueError):
            have = None
        if have != want:
            diff = sorted(k for k in want if not isinstance(have, dict) or have.get(k) != want[k])
            raise StageError(
                f"the work directory was made for another recipe (differs in: {', '.join(diff) or 'its record'})",
                where=str(record),
                fix="give --dir a new directory, or remove this one",
            )
        return
    if work.exists() and any(work.iterdir()):
        raise StageError(
            "the work directory holds something else (no record of a --train-base recipe in it): its "
            "checkpoint or data would be taken as this base's",
            where=str(work),
            fix="give --dir a new or empty directory",
        )
    work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(record, json.dumps(want, indent=1, sort_keys=True) + "\n")


def require_publishable(r: BaseRecipe, retrieval: list[Retrieval]) -> None:
    """A base is published only when every task of the recipe's bar retrieves at its own window (the
    recipe's publish_bar); the card states every task it measured either way."""
    own = {x.task: x for x in retrieval if x.length == r.seq_length}
    short = [
        f"{t}: " + ("not measured" if t not in own else f"{100 * own[t].exact:.0f} % of {own[t].keys} keys")
        for t in r.bar_tasks or r.eval_tasks
        if t not in own or own[t].exact < r.publish_bar
    ]
    if short:
        raise StageError(
            f"the base retrieves below the {100 * r.publish_bar:.0f} % a published base must reach at its "
            f"window of {r.seq_length} tokens ({'; '.join(short)}): nothing was published",
            where="longctx demo --train-base",
            fix="the work directory keeps the checkpoint; train longer (the recipe's iterations) or fix the recipe",
        )


def train_base(work: Path, out_dir: Path, *, recipe: BaseRecipe | None = None, echo: Echo = print) -> Card:
    """Every step of the module docstring; a rerun keeps what exists and resumes the training. The work
    directory is claimed for the recipe and locked for the whole run."""
    r = recipe or BaseRecipe()
    work = work.resolve()
    claim_work_dir(work, r)
    with run_lock(work, "train-base"):
        return _train_base_locked(work, out_dir, r, echo)


def _train_base_locked(work: Path, out_dir: Path, r: BaseRecipe, echo: Echo) -> Card:
    with _step(echo, "tokenizer") as say:
        say.append(_tokenizer(work, r))
    for i, phase in enumerate(r.phases):
        with _step(echo, f"phase {phase.name}: corpus and data") as say:
            say.append(_data(work, r, phase))
        with _step(echo, f"phase {phase.name}: train") as say:
            say.append(_train(work, r, i))
    wall = _wall(work, 0.0)
    digits = "any digits" if r.eval_any_digit else "distinct digits"
    with _step(echo, f"retrieval (greedy exact match, keys of {digits})") as say:
        retrieval = measure(work, r)
        say.append(", ".join(f"{x.task} {x.length}: {100 * x.exact:.0f} % of {x.keys}" for x in retrieval))
    require_publishable(r, retrieval)
    with _step(echo, "publish") as say:
        card = publish(work, out_dir, r, wall, retrieval)
        say.append(f"→ {out_dir}")
    return card
