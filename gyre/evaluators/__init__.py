"""Evaluators: score a kept workspace against pristine hidden tests; failures are never zeros."""
