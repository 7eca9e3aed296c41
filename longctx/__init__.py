"""longctx: staged long-context continued pretraining for Megatron-LM models."""

__version__ = "0.1.0"
