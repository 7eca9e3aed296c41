"""The plan's objective against its tokenizer and base checkpoint: vocabulary rows, the [MASK] id, and
the refusals of an objective that contradicts what the checkpoint was trained as."""

from __future__ import annotations

from longctx.checkpoint.family import FamilyReport
from longctx.objective import Objective
from longctx.report import Findings
from longctx.tokenizer.padding import padded_vocab_size


def vocab_rows(obj: Objective, vocab: int, divisible_by: int, tp: int) -> tuple[int, int | None]:
    """(input-embedding rows, output-layer rows or None when equal). Autoregressive: Megatron's padded
    vocabulary. Diffusion models are built unpadded: mdm input = vocabulary + the [MASK] row, output =
    vocabulary; udm both = vocabulary; `input_rows` / `output_rows` override (a checkpoint's padding). Only
    the masked objective's output differs from its input by default (no [MASK] logit): an autoregressive or
    uniform-state plan that sets input_rows gets as many output rows."""
    if obj.kind == "ar":
        inp = obj.input_rows or padded_vocab_size(vocab, divisible_by, tp)
        out = obj.output_rows or inp
    elif obj.kind == "mdm":
        inp, out = obj.input_rows or vocab + 1, obj.output_rows or vocab
    else:
        inp = obj.input_rows or vocab
        out = obj.output_rows or inp
    return inp, (None if out == inp else out)


def resolve_objective(obj: Objective, vocab: int) -> Objective:
    """`obj` with its [MASK] id decided: the plan's, else the tokenizer's vocabulary size."""
    if obj.kind == "mdm" and obj.mask_id is None:
        return obj.model_copy(update={"mask_id": vocab})
    return obj


def check_vocab_rows(
    obj: Objective, vocab: int, rows: tuple[int, int | None], untied: bool, where: str, findings: Findings
) -> None:
    """Rows that cannot hold the objective's tokens."""
    inp, out = rows
    if inp < vocab or (out or inp) < vocab:
        findings.error(
            "objective-rows",
            f"{inp} input / {out or inp} output rows cannot hold the tokenizer's {vocab} tokens",
            where=where,
            fix="raise [objective] input_rows / output_rows to at least the vocabulary size (or unset them)",
        )
    if obj.kind == "mdm" and obj.mask_id is not None and obj.mask_id >= inp:
        findings.error(
            "mask-row",
            f"mask id {obj.mask_id} has no input-embedding row ({inp} rows)",
            where=where,
            fix=f"set [objective] input_rows = {obj.mask_id + 1} (the [MASK] row) or a mask_id below {inp}",
        )
    if out is not None and not untied:
        findings.error(
            "objective-rows",
            f"{inp} input rows and {out} output rows need separate weights, but the model ties them",
            where=where,
            fix="set [model] untie_embeddings_and_output_weights = true, or equal input_rows and output_rows",
        )


def check_against_base(
    obj: Objective, family: FamilyReport, rows: tuple[int, int | None], where: str, findings: Findings
) -> None:
    """The plan's objective and vocabulary rows against the family the base checkpoint was trained as."""
    if family.time_conditioning_keys:
        findings.error(
            "base-family",
            f"the base checkpoint is a {family.label} model with {len(family.time_conditioning_keys)} "
            f"time-conditioning tensors ({family.time_conditioning_keys[0]}, …), which longctx's trainer does "
            "not build: they would be dropped and the model would lose its conditioning on t",
            where=where,
            fix="continue this model with the fork that built it; longctx trains models without time conditioning",
        )
        return
    fam = family.family
    evidence = "; ".join(family.evidence)
    if obj.kind == "ar" and fam in ("MDM", "UDM"):
        findings.error(
            "base-family",
            f"the base checkpoint is a {family.label} model ({evidence}), but the plan trains it with the "
            "autoregressive objective (causal attention, next-token loss), which would overwrite it",
            where=where,
            fix=f'set [objective] kind = "{fam.lower()}" to continue it as a diffusion model, or use an ARM base',
        )
    elif obj.kind == "mdm" and family.mask_id is None:
        findings.error(
            "base-family",
            f"the plan trains a masked-diffusion objective but the base checkpoint ({family.label}) has no "
            "[MASK] row: its input embedding is not one row larger than its output layer",
            where=where,
            fix='use a masked-diffusion (MDM) base, or set [objective] kind = "ar" / "udm" to match the checkpoint',
        )
    elif obj.kind == "mdm" and obj.mask_id != family.mask_id:
        findings.error(
            "mask-id",
            f"the plan's mask id {obj.mask_id} is not the base checkpoint's {family.mask_id} "
            f"({family.mask_id_source})",
            where=where,
            fix=f"set [objective] mask_id = {family.mask_id} (or unset it when the tokenizer's size is the mask id)",
        )
    elif obj.kind == "udm" and fam in ("ARM", "MDM"):
        findings.error(
            "base-family",
            f"the plan trains a uniform-state diffusion objective but the base checkpoint is a {family.label} "
            f"model ({evidence})",
            where=where,
            fix=f'set [objective] kind = "{fam.lower() if fam == "MDM" else "ar"}" to match the checkpoint',
        )
    if obj.kind != "ar":  # an autoregressive base's padding is checked with its tokenizer
        _check_rows(family, rows, where, findings)
    if family.expert_layout == "per-expert":
        findings.error(
            "expert-layout",
            "the base checkpoint stores its experts per expert (`local_experts.{e}.…`); the trainer loads "
            "megatron-core's stacked expert layout (`experts.experts.…` [E, …]) only",
            where=where,
            fix="re-save the checkpoint in the stacked expert layout that megatron-core's dist-checkpoint saves "
            "of SequentialMLP and grouped-GEMM experts write",
        )


def _check_rows(family: FamilyReport, rows: tuple[int, int | None], where: str, findings: Findings) -> None:
    inp, out = rows
    have_in, have_out = family.input_vocab_rows, family.output_vocab_rows or family.input_vocab_rows
    if have_in is None or (inp == have_in and (out or inp) == have_out):
        return
    findings.error(
        "vocab-rows",
        f"the plan builds {inp} input / {out or inp} output vocabulary rows, the base checkpoint has "
        f"{have_in} / {have_out}",
        where=where,
        fix=f"set [objective] input_rows = {have_in} and output_rows = {have_out}",
    )


__all__ = ["check_against_base", "check_vocab_rows", "resolve_objective", "vocab_rows"]


# the noise schedule's knobs keep the ELBO's endpoints finite; past these they decide the loss instead
MAX_T_MIN = 0.1
MAX_EPS = 0.1


def check_schedule(obj: Objective, where: str, findings: Findings) -> None:
    """A diffusion schedule whose t_min or eps leaves most noise levels untrained is an error."""
    if obj.kind == "ar":
        return
    if obj.t_min is not None and obj.t_min > MAX_T_MIN:
        findings.error(
            "diffusion-schedule",
            f"objective.t_min {obj.t_min} trains only noise levels t ≥ {obj.t_min}: "
            "the model never learns to denoise lightly masked text",
            where=where,
            fix=f"keep t_min at most {MAX_T_MIN} (default: 1e-6 for mdm, 1e-3 for udm)",
        )
    if obj.eps > MAX_EPS:
        findings.error(
            "diffusion-schedule",
            f"objective.eps {obj.eps} keeps α_1 = {obj.eps}: at full noise that "
            "share of tokens stays clean, so the prior the sampler starts from is not the one trained",
            where=where,
            fix=f"keep eps at most {MAX_EPS} (default 1e-3)",
        )
