"""Rollout and train engines behind small interfaces; torch reference backends by default."""
