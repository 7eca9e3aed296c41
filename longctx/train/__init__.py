"""The local backend: a compact trainer on megatron-core (CPU or one GPU, DP and CP over torchrun)."""
