"""Which kind of trajectory is this: main, main-summary, sub-agent or sub-agent-summary.

The harness is a black box: gyre sees only the calls. The kind decides what Jmax sampling
keeps (main > main-summary > sub-agent > sub-agent-summary), so the rules are spelled out
here and the classifier is pluggable (`Classifier`: a tree in, one kind per trajectory
out). `RuleClassifier` decides two things per trajectory, from hints first and the call
stream second.

Agent family (main or sub-agent):
  1. agent id: if the proxy recorded agent ids (a harness header, or
     `ClassifierHints.main_agent_id`), the trajectory's family is whether its last call's
     agent is the main agent (by default the agent of the execution's first call).
  2. otherwise, the system prompt: the main agent re-sends its system prompt and tool
     definitions on every call, even after compaction (Claude Code: ~6k characters in 3
     blocks plus 12-24 tools, most of the first request), while a sub-agent has its own
     system prompt. A trajectory is main iff it shares at least `main_share` (0.5) of the
     execution's first prompt.

Summary (the trajectory ends in a compaction call):
  a. hint: the last call's prompt ends with the harness's compaction instruction
     (`compaction_markers`: token-id sequences searched in its last `marker_window` tokens);
  b. structure: the last call's output opens a later *fresh* call: one of the next
     `probe_next_calls` calls whose prompt extends no earlier call's prompt + output (a new
     context) carries it within `summary_slack` tokens of where its prompt leaves the tree
     (after the system prompt and tools, behind a short "continued from a previous
     conversation" wrapper). A `probe_tokens` window from the middle of the output is
     searched, so a template re-tokenising its edges does not hide it. A sub-agent's report
     also reappears, but in its parent's next call, which extends the parent's context (not
     fresh), and deep inside a summariser's copy of the history (not at its start).
  A summary's family is that of the call that continues from it (the fresh call of rule
  b), else its own: a compaction run under a separate summariser system prompt is still
  the main agent's summary.

A trajectory whose last call failed these tests is `main` or `sub-agent` by family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from gyre.trajectories.tree import Node, Trajectory, TrajectoryTree

KINDS = ("main", "main-summary", "sub-agent", "sub-agent-summary")
KIND_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


class Classifier(Protocol):
    def classify(self, tree: TrajectoryTree) -> list[str]:
        """One kind (from KINDS) per `tree.trajectories`, in the same order."""
        ...


@dataclass(frozen=True)
class ClassifierHints:
    main_agent_id: str | None = None
    """The main agent's id when the harness names it; else the first call's agent id, if any."""
    compaction_markers: tuple[tuple[int, ...], ...] = ()
    """Token ids of the harness's compaction instruction(s)."""
    main_share: float = 0.5
    """Least fraction of the first prompt a main-agent trajectory shares (no agent ids)."""
    marker_window: int = 8192
    """Prompt tokens, from the end of the last call's prompt, searched for a compaction marker."""
    probe_tokens: int = 16
    """Length of the output window looked for in later fresh calls."""
    probe_next_calls: int = 8
    """Fresh calls after the last call that are searched for its output."""
    summary_slack: int = 2048
    """The output must start within this many tokens of where a fresh call's new part begins."""


def contains(haystack: np.ndarray, needle: np.ndarray) -> bool:
    """Whether `needle` occurs in `haystack` (vectorised first-token filter, then exact check)."""
    m = len(needle)
    if m == 0:
        return True
    if len(haystack) < m:
        return False
    starts = np.flatnonzero(haystack[: len(haystack) - m + 1] == needle[0])
    return any(np.array_equal(haystack[s : s + m], needle) for s in starts)


def common_prefix(a: tuple[Node, int], b: tuple[Node, int]) -> int:
    """Length of the common prefix of two tree positions (node, tokens into that node)."""
    (node_a, off_a), (node_b, off_b) = a, b
    ancestors: dict[int, int] = {}
    up, off = node_a, off_a
    while up is not None:
        ancestors[id(up)] = off
        up, off = up.parent, (up.parent.n if up.parent is not None else 0)
    up, off = node_b, off_b
    while id(up) not in ancestors:
        up, off = up.parent, up.parent.n
    return up.start_depth + min(off, ancestors[id(up)])


class RuleClassifier:
    """The rules of this module's docstring."""

    def __init__(self, hints: ClassifierHints = ClassifierHints()) -> None:
        self.hints = hints

    def classify(self, tree: TrajectoryTree) -> list[str]:
        return [self._kind(tree, traj) for traj in tree.trajectories]

    def _is_main_call(self, tree: TrajectoryTree, call: int, position: tuple[Node, int]) -> bool:
        main_agent = self.hints.main_agent_id or tree.calls[0].agent_id
        agent = tree.calls[call].agent_id
        if main_agent is not None and agent is not None:
            return agent == main_agent
        first_prompt = len(tree.calls[0].prompt_ids)
        first = tree.prompt_node[0]
        shared = common_prefix(position, (first, first_prompt - first.start_depth))
        return shared >= self.hints.main_share * first_prompt

    def _kind(self, tree: TrajectoryTree, traj: Trajectory) -> str:
        main = self._is_main_call(tree, traj.leaf_call, (traj.leaf, traj.leaf.n))
        summary, continued_main = self._summary(tree, traj.leaf_call)
        if summary and continued_main is not None:
            main = continued_main
        if main:
            return "main-summary" if summary else "main"
        return "sub-agent-summary" if summary else "sub-agent"

    def _summary(self, tree: TrajectoryTree, leaf_call: int) -> tuple[bool, bool | None]:
        call = tree.calls[leaf_call]
        marked = any(
            contains(call.prompt_ids[-self.hints.marker_window :], np.asarray(m, dtype=call.prompt_ids.dtype))
            for m in self.hints.compaction_markers
        )
        out = call.output_ids
        k = self.hints.probe_tokens
        if len(out) >= k:
            mid = (len(out) - k) // 2
            probe = out[mid : mid + k]
            checked = 0
            for later in range(leaf_call + 1, len(tree.calls)):
                if tree.extends_earlier[later]:
                    continue
                start = tree.new_from[later]
                new_part = tree.calls[later].prompt_ids[start : start + len(out) + self.hints.summary_slack]
                if contains(new_part, probe):
                    node = tree.prompt_node[later]
                    position = (node, len(tree.calls[later].prompt_ids) - node.start_depth)
                    return True, self._is_main_call(tree, later, position)
                checked += 1
                if checked >= self.hints.probe_next_calls:
                    break
        return marked, None
