"""Prefect tasks: one thin wrapper per stage of a step, each calling one coordinator method.

They exist so the Prefect UI shows every execution, evaluation and optimizer step as its
own task run (with retries and reruns where that is safe); the logic lives below.
"""
