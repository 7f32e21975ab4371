"""The model-call proxy: OpenAI + Anthropic HTTP APIs in front of rollout engines, recording TITO."""
