"""The values a resolved plan hands downstream: every path absolute, every path-bearing table of the plan
turned into a frozen dataclass, worked out once by `resolve_plan` (longctx.plan.derive).

Only `longctx.plan` reads the raw `Plan` and resolves its path strings (`longctx.plan.paths`); the stage
machine, the backends, Slurm, evaluation, export and the CLI receive these values.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from longctx.megatron_versions import MegatronFacts, facts
from longctx.plan import paths
from longctx.plan.schema import DataSpec, Plan, TierMix
from longctx.tokenizer import EncodingSpec, TokenizerManifest, declared_spec
from longctx.util.wandb_settings import WandbSettings


@dataclasses.dataclass(frozen=True)
class TokenizerValues:
    """The plan's [tokenizer] table, resolved."""

    path: Path
    """The tokenizer (a Hugging Face tokenizer directory or a SentencePiece model), absolute."""

    manifest_path: Path
    """The tokenizer manifest (tokenization/*.toml) the plan names, absolute."""

    manifest: TokenizerManifest
    """That manifest, read: what "the right tokenizer" means (md5, vocab size, special ids, type)."""

    megatron_type: str | None
    """The plan's tokenizer.megatron_type as written; None: the manifest's type applies."""

    megatron_version: str
    """The plan's Megatron-LM release, whose defaults say how a type encodes when the plan does not."""

    @property
    def kind(self) -> str:
        """Megatron-LM's --tokenizer-type: the plan's megatron_type, else the manifest's."""
        return self.megatron_type or self.manifest.megatron_tokenizer_type

    def encoding(self) -> EncodingSpec | None:
        """How the tokenizer encodes as the plan declares it: the declared type (else the manifest's) with the
        manifest's pinned options, else the defaults of the plan's Megatron-LM release; None when neither is
        known. Raises TokenizerError when that release cannot say the pinned encoding (computed on use, as a
        plan may be checked for a release it will never launch on)."""
        return declared_spec(self.megatron_type, self.manifest, self.megatron_version)


@dataclasses.dataclass(frozen=True)
class BaseValues:
    """The plan's [base] table: the checkpoint the first stage starts from, resolved."""

    path: Path | None
    """The torch_dist save dir (base.path), absolute; None when only a hub id is given."""

    hub_id: str | None
    """The Hugging Face hub repository the base comes from, if any."""

    revision: str | None
    """The hub revision, if pinned."""

    iteration: int | None
    """The iteration the base's tracker must name (None: whatever it names)."""

    seq_length: int
    """The base's pretraining sequence length."""

    rotary_base: int
    """The base's pretraining --rotary-base."""

    model_only: bool
    """A model-only checkpoint (no optimizer or RNG state)."""


@dataclasses.dataclass(frozen=True)
class MegatronValues:
    """The plan's [megatron] table: the Megatron-LM release the cluster runs, and what it knows."""

    version: str
    """The release ([megatron].version), as written."""

    facts: MegatronFacts
    """The release table folded up to `version` (longctx.megatron_versions.facts): flags, defaults, eras."""

    path: Path | None
    """The Megatron-LM checkout ([megatron].path), absolute; None when the plan names none."""

    entry_script: str
    """The script each launch runs, relative to the checkout (or absolute)."""

    family_args: tuple[str, ...]
    """The entry script's own flags, "{name}" words not yet filled in (longctx.plan.entry)."""

    attention_backend: str
    """The attention kernel (--attention-backend) the plan asks of TransformerEngine."""

    performance_args: tuple[str, ...]
    """Runtime flags that do not change the maths (fusions, overlaps), appended to every launch."""


@dataclasses.dataclass(frozen=True)
class StageData:
    """A stage's data (its own [stages.data], else [defaults.data]) with every path absolute."""

    blend_file: Path | None
    """A Megatron --data-args-path file ("w1 p1 w2 p2 …")."""

    blend: tuple[tuple[float, Path], ...] | None
    """An inline blend: (weight, prefix) pairs."""

    prefixes: tuple[Path, ...] | None
    """Prefixes weighted by size, as Megatron does for a plain list."""

    tier_mix: TierMix | None
    """Length tiers of a tokenized artifact (its `artifact` as written; the resolved path is `artifact`)."""

    artifact: Path | None
    """The tier mix's artifact directory, absolute (None without a tier mix)."""

    split: str
    """Megatron's --split (train, validation, test weights)."""

    cache_dir: Path | None
    """Megatron's --data-cache-path as given; None: `<run_dir>/cache`."""

    packing: str
    """"concat" (attention across stitched documents) or "documents" (within each document)."""

    reset_position_ids: bool
    """Position ids restart at every document (Megatron's --reset-position-ids)."""


def resolve_tokenizer(plan: Plan, manifest_path: Path, manifest: TokenizerManifest) -> TokenizerValues:
    return TokenizerValues(
        path=paths.resolve(plan.tokenizer.path, plan, field="tokenizer.path"),
        manifest_path=manifest_path,
        manifest=manifest,
        megatron_type=plan.tokenizer.megatron_type,
        megatron_version=plan.megatron.version,
    )


def resolve_base(plan: Plan) -> BaseValues:
    b = plan.base
    return BaseValues(
        path=paths.resolve(b.path, plan, field="base.path") if b.path else None,
        hub_id=b.hub_id,
        revision=b.revision,
        iteration=b.iteration,
        seq_length=b.seq_length,
        rotary_base=b.rotary_base,
        model_only=b.model_only,
    )


def resolve_megatron(plan: Plan) -> MegatronValues:
    m = plan.megatron
    return MegatronValues(
        version=m.version,
        facts=facts(m.version),
        path=paths.resolve(m.path, plan, field="megatron.path") if m.path else None,
        entry_script=m.entry_script,
        family_args=tuple(m.family_args),
        attention_backend=m.attention_backend,
        performance_args=tuple(m.performance_args),
    )


def resolve_wandb(plan: Plan) -> WandbSettings | None:
    """The plan's [wandb] table with its save_dir absolute (None: no W&B)."""
    w = plan.wandb
    if w is None or w.save_dir is None:
        return w
    return w.model_copy(update={"save_dir": str(paths.resolve(w.save_dir, plan, field="wandb.save_dir"))})


def stage_wandb(wandb: WandbSettings | None, stage: str, stage_dir: Path) -> WandbSettings | None:
    """None when the plan logs no W&B; else the stage's run: `<exp_name>-<stage>`, its own save dir
    (`<save_dir>/<stage>`, else `<stage dir>/wandb`)."""
    if wandb is None:
        return None
    save_dir = Path(wandb.save_dir) / stage if wandb.save_dir else stage_dir / "wandb"
    return wandb.model_copy(update={"exp_name": f"{wandb.exp_name}-{stage}", "save_dir": str(save_dir)})


def resolve_data(plan: Plan, stage: str, d: DataSpec | None) -> StageData | None:
    if d is None:
        return None
    tm = d.tier_mix
    return StageData(
        blend_file=paths.resolve(d.blend_file, plan, field="data.blend_file")
        if d.blend_file is not None
        else None,
        blend=tuple((float(w), paths.resolve(p, plan, field="data.blend")) for w, p in d.blend)
        if d.blend is not None
        else None,
        prefixes=tuple(paths.resolve(p, plan, field="data.prefixes") for p in d.prefixes)
        if d.prefixes is not None
        else None,
        tier_mix=tm,
        artifact=paths.resolve(tm.artifact, plan, field=f"stages[{stage}].data.tier_mix.artifact")
        if tm is not None
        else None,
        split=d.split,
        cache_dir=paths.resolve(d.cache_dir, plan, field="data.cache_dir") if d.cache_dir else None,
        packing=d.packing,
        reset_position_ids=d.reset_position_ids,
    )
