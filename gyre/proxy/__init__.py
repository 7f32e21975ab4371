"""The model-call proxy: OpenAI-compatible HTTP in front of rollout engines, recording TITO."""
