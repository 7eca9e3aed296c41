"""Stages on disk: what runs next (state machine), the ledger, Megatron-LM argv, process launch."""
