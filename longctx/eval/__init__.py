"""Long-context evaluation of checkpoints: passkey / needle grid, loss by position, short-context
regression, plots. The stage launcher calls `evaluate_finished_stage(rp, stage)` after a local stage.

Public API (torch and megatron-core are imported by the submodules that need them)::

    from longctx.eval.runner import (evaluate_finished_stage, summarize_plan, evaluate_path,
                                     evaluate_checkpoints, demo_summary, render_summary)
    from longctx.eval.engine import evaluate_checkpoints, CheckpointRef   # the engine runner builds on
    from longctx.eval.settings import EvalSettings            # what is measured (no torch import)
    from longctx.eval.grid import PasskeyGrid                 # exact-length passkey prompts
    from longctx.eval.needles import TaskGrid                 # RULER's needle tasks (multi-key, …)
    from longctx.eval.task_score import score_tasks           # … answered by greedy generation
    from longctx.eval.score import model_scorer, score_passkey
    from longctx.eval.load import checkpoint_info, load_model
    from longctx.mcore.parallel import eval_parallel
"""
