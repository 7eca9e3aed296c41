"""The scalar tags of training events: Megatron-LM's (`megatron/training/training.py`, `training_log` and
`evaluate_and_print_results`) and the one longctx adds. Its own module so that readers need not import
the writer (torch's SummaryWriter)."""

# Megatron-LM's tag names (training_log)
LOSS = "lm loss"
LEARNING_RATE = "learning-rate"
GRAD_NORM = "grad-norm"
BATCH_SIZE = "batch-size"
ITERATION_TIME = "iteration-time"
THROUGHPUT = "throughput"  # Megatron-LM's: TFLOP/s per GPU
VALIDATION_LOSS = "lm loss validation"
VS_SAMPLES = " vs samples"
# longctx's own (Megatron-LM has no tokens/s tag)
TOKENS_PER_SECOND = "tokens-per-second"
