"""What an evaluation measures (pydantic only: the CLI reads it without importing torch).

The fields are the plan's `[eval]` table (`longctx.plan.schema.EvalSpec`): a plan says what its
evaluation measures, and options of `eval run` / `eval summary` override single fields."""

from __future__ import annotations

import hashlib

from longctx.plan.schema import DEFAULT_EVAL_DEPTHS, EvalSpec

DEFAULT_DEPTHS = DEFAULT_EVAL_DEPTHS
# bump when a change of the code changes what the same settings measure: cached results then expire
RESULTS_VERSION = 6


class EvalSettings(EvalSpec):
    """What is measured; everything here except `batch_size` changes the numbers."""

    @classmethod
    def of(cls, spec: EvalSpec) -> EvalSettings:
        """The settings of a plan's `[eval]` (a resolved plan's `rp.eval`)."""
        return spec if isinstance(spec, cls) else cls.model_validate(spec.model_dump())

    def fingerprint(self, *extra: object) -> str:
        data = self.measured()
        text = f"v{RESULTS_VERSION}|" + repr(sorted(data.items())) + "|" + "|".join(map(str, extra))
        return hashlib.sha256(text.encode()).hexdigest()[:20]
