"""TRL GRPOConfig -> rlzoo loss (placeholder)."""
