"""The one-command CPU demo: tokenizer, long synthetic corpus, base model, staged extension, evaluation."""
