"""The OpenEuroLLM tokenized long-context artifact: layout, fetch, checks and tier mixes."""
