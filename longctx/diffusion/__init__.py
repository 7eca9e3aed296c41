"""The diffusion objectives' maths (torch only): noise schedules and draws, per-token bounds. Shared by
the local trainer and the evaluation."""
