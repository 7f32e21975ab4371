"""Harnesses: agents that drive the model through the proxy (builtin, text, claude-code, mini-swe-agent, command),
and `sleepy`, a benchmark load that waits out simulated durations between real calls.

`make_harness(config)` builds the one a run's `harness` config names, so the coordinator
never branches on harness types.
"""

from __future__ import annotations

from gyre.config.run import HarnessConfig
from gyre.harnesses.base import Harness
from gyre.harnesses.sleepy import Durations


def make_harness(config: HarnessConfig, durations: Durations | None = None) -> Harness:
    """The harness `config` names; `durations` is what a `sleepy` one waits out (the runtime's
    `gyre.runtime.simulated_durations.for_harness`), unused by every other type."""
    if config.type == "builtin":
        from gyre.harnesses.builtin import BuiltinHarness

        return BuiltinHarness(
            max_turns=config.max_turns,
            command_timeout_s=config.command_timeout_s,
            max_tool_output_chars=config.max_tool_output_chars,
            compaction_threshold_tokens=config.compaction_threshold_tokens,
            max_sub_agents=config.max_sub_agents,
            sub_agent_max_turns=config.sub_agent_max_turns,
        )
    if config.type == "text":
        from gyre.harnesses.text_agent import TextHarness

        return TextHarness(max_turns=config.max_turns, command_timeout_s=config.command_timeout_s,
                           max_output_chars=config.max_tool_output_chars, default_file=config.text_default_file,
                           run_first=config.text_run_first)
    if config.type == "claude-code":
        from gyre.harnesses.claude_code import ClaudeCodeHarness

        return ClaudeCodeHarness(max_turns=config.max_turns)
    if config.type == "sleepy":
        from gyre.harnesses.sleepy import SleepyHarness

        if durations is None:
            raise ValueError("harness.type sleepy waits out durations the runtime draws "
                             "(gyre.runtime.simulated_durations.for_harness); none were given")
        return SleepyHarness(durations, config.sleepy_calls)
    if config.type == "mini-swe-agent":
        from gyre.harnesses.mini_swe_agent import MiniSweAgentHarness

        return MiniSweAgentHarness()
    from gyre.harnesses.command import CommandHarness

    if not config.command:
        raise ValueError("harness.command must be a non-empty argv when harness.type is 'command'")
    return CommandHarness(config.command)
