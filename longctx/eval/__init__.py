"""Long-context evaluation of checkpoints: passkey / needle grid, loss by position, short-context
regression, plots. The stage launcher calls `evaluate_finished_stage(rp, stage)` after a local stage.

Public API (torch and megatron-core are imported by the submodules that need them)::

    from longctx.eval.runner import evaluate_finished_stage, evaluate_path, summarize_plan, evaluate_checkpoints
    from longctx.eval.grid import PasskeyGrid                 # exact-length passkey prompts
    from longctx.eval.score import model_scorer, score_passkey
    from longctx.eval.load import checkpoint_info, eval_parallel, load_model
"""
