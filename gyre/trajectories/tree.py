"""The trajectory tree: all calls of one execution as one prefix-sharing tree of token runs.

Why a tree. A harness run is not one chat. Claude Code re-sends its whole history on
every call (so call k+1's prompt is call k's prompt + output + the tool result), compacts
that history into a summary past a token threshold (a fresh context that shares only the
system prompt and tools), spawns sub-agents with their own system prompt, and retries a
failed request by re-sending the same prompt. Laid out per call, a 1M-token execution is
tens of millions of tokens; laid out per root-to-leaf path it still repeats every shared
prefix once per branch. As a tree, each distinct token-in-context is stored once:

    root
     └─ [system + tools ...]                         shared by every main-agent context
         ├─ [task, call 1 out, tool, call 2 out, ...]  one node while calls only extend
         │    ├─ [call 7 out (aborted)]              a retry re-sent call 7's prompt: a branch
         │    └─ [call 7' out, tool, ...]            at the end of that prompt
         └─ [summary, call 40 out, ...]              after compaction: branch after the tools

A node is a run of tokens; a child starts where its parent ends (nodes split only where
two calls diverge, so a chain of calls that extend each other is one node). Each token
keeps its origin: the call that first put it there, whether that call *sampled* it
(an output token: trainable, with its behaviour log-prob) or sent it (a prompt token:
context only). A trajectory is a root-to-leaf path; its tokens are exactly the last
call's prompt + output.

Building is one walk per call: the prompt is matched against the tree from the root with
one vectorised comparison per node on its path (nodes on a path are few: one per branch
point), the unmatched rest is appended to a leaf or hung under a new node, and the same
for the output. Storage is O(unique tokens): node runs are growable arrays (amortised
doubling), a split hands out views, never copies. The only work proportional to the sum
of prompt lengths is that vectorised prefix check (memcmp speed; see bench/trajectories.py).

Facts the classifier needs are recorded while building: where each call's prompt and
full sequence end in the tree (markers that move with node splits), whether a call's
prompt was re-sent later (a retry), whether a call extends an earlier call's full
sequence, and prompts that contradict an earlier call's recorded output (counted; the
tree simply branches there, and the contradicting tokens are context, never targets).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from gyre.trajectories.tokens import CallInputError, CallTokens, check_call

PROMPT_END, FULL_END = 0, 1


class Node:
    """A run of tokens in the tree. `start_depth` is the path length before its first token."""

    __slots__ = ("index", "parent", "start_depth", "children", "n", "_tok", "_lp", "_org", "_trn",
                 "markers", "first_full_end", "num_trainable")

    def __init__(self, index: int, parent: "Node | None", start_depth: int) -> None:
        self.index = index
        self.parent = parent
        self.start_depth = start_depth
        self.children: dict[int, Node] = {}
        self.n = 0
        self._tok = np.empty(0, np.int32)
        self._lp = np.empty(0, np.float32)
        self._org = np.empty(0, np.int32)
        self._trn = np.empty(0, np.bool_)
        self.markers: dict[int, list[tuple[int, int]]] = {}  # offset -> [(call, PROMPT_END|FULL_END)]
        self.first_full_end: int | None = None  # smallest offset holding a FULL_END marker
        self.num_trainable = 0

    @property
    def tokens(self) -> np.ndarray:
        return self._tok[: self.n]

    @property
    def logprobs(self) -> np.ndarray:
        return self._lp[: self.n]

    @property
    def origin(self) -> np.ndarray:
        return self._org[: self.n]

    @property
    def trainable(self) -> np.ndarray:
        return self._trn[: self.n]

    @property
    def end_depth(self) -> int:
        return self.start_depth + self.n

    def append(self, tok, lp, org, trn) -> None:
        m = len(tok)
        if self.n + m > len(self._tok):
            cap = max(2 * len(self._tok), self.n + m, 64)
            for name in ("_tok", "_lp", "_org", "_trn"):
                old = getattr(self, name)
                new = np.empty(cap, old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
        self._tok[self.n : self.n + m] = tok
        self._lp[self.n : self.n + m] = lp
        self._org[self.n : self.n + m] = org
        self._trn[self.n : self.n + m] = trn
        self.n += m

    def __repr__(self) -> str:
        return f"Node({self.index}, depth {self.start_depth}+{self.n}, {len(self.children)} children)"


@dataclass
class Trajectory:
    """A root-to-leaf path: the last call's prompt + output, with the calls that end on it."""

    leaf: Node
    nodes: list[Node]  # root excluded, root to leaf
    call_indices: list[int]  # calls whose full sequence ends on this path, in call order
    leaf_call: int
    retried: bool  # the leaf call's prompt was re-sent by a later call
    kind: str = ""  # set by a classifier: main | main-summary | sub-agent | sub-agent-summary

    @property
    def num_tokens(self) -> int:
        return self.leaf.end_depth

    @property
    def num_trainable(self) -> int:
        return sum(node.num_trainable for node in self.nodes)


@dataclass
class TrajectoryTree:
    execution_id: str
    calls: list[CallTokens]  # in insertion order (start time, then given order)
    root: Node
    nodes: list[Node]
    prompt_node: list[Node]  # where each call's prompt ends
    end_node: list[Node]  # where each call's full sequence ends
    retried_by: dict[int, int]  # call -> the later call that re-sent its prompt
    extends_earlier: list[bool]  # call's prompt contains an earlier call's full sequence
    new_from: list[int]  # depth at which each call's prompt left the tree (its new part)
    contradictions: list[int] = field(default_factory=list)  # calls whose prompt contradicts a recorded output
    trajectories: list[Trajectory] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(node.n for node in self.nodes)

    @property
    def num_trainable(self) -> int:
        return sum(node.num_trainable for node in self.nodes)

    def path_tokens(self, traj: Trajectory) -> np.ndarray:
        return np.concatenate([node.tokens for node in traj.nodes])


class _Builder:
    def __init__(self, execution_id: str, calls: list[CallTokens]) -> None:
        self.root = Node(0, None, 0)
        self.nodes: list[Node] = []
        self.calls = calls
        self.prompt_node: list[Node] = [self.root] * len(calls)
        self.end_node: list[Node] = [self.root] * len(calls)
        self.contradictions: list[int] = []
        self.execution_id = execution_id

    def _new_node(self, parent: Node) -> Node:
        node = Node(len(self.nodes) + 1, parent, parent.end_depth)
        self.nodes.append(node)
        return node

    def _split(self, node: Node, k: int) -> None:
        """Cut `node` after its first k tokens; the tail becomes its only child (views, no copy)."""
        tail = self._new_node(node)
        tail.start_depth = node.start_depth + k
        tail.n = node.n - k
        tail._tok, tail._lp, tail._org, tail._trn = (a[k : node.n] for a in (node._tok, node._lp, node._org, node._trn))
        node._tok, node._lp, node._org, node._trn = (a[:k] for a in (node._tok, node._lp, node._org, node._trn))
        node.n = k
        tail.children, node.children = node.children, {int(tail._tok[0]): tail}
        for child in tail.children.values():
            child.parent = tail
        moved = {off: ms for off, ms in node.markers.items() if off > k}
        for off, ms in moved.items():
            del node.markers[off]
            tail.markers[off - k] = ms
            for call, kind in ms:
                (self.prompt_node if kind == PROMPT_END else self.end_node)[call] = tail
        node.first_full_end, tail.first_full_end = _first_full_end(node), _first_full_end(tail)

    def _descend(self, node: Node, off: int, seq: np.ndarray, i: int) -> tuple[Node, int, int, bool]:
        """Match seq[i:] from position (node, off); return where matching stopped and whether it
        stopped on a mismatch inside a node (not at a node end)."""
        while i < len(seq):
            if off == node.n:
                child = node.children.get(int(seq[i]))
                if child is None:
                    return node, off, i, False
                node, off = child, 0
            m = min(node.n - off, len(seq) - i)
            diff = np.flatnonzero(node._tok[off : off + m] != seq[i : i + m])
            k = int(diff[0]) if diff.size else m
            off, i = off + k, i + k
            if k < m:
                return node, off, i, True
        return node, off, i, False

    def _attach(self, node: Node, off: int, tok, lp, org, trn) -> tuple[Node, int]:
        if off < node.n:
            self._split(node, off)
        if node is not self.root and not node.children:
            node.append(tok, lp, org, trn)
        else:
            child = self._new_node(node)
            child.append(tok, lp, org, trn)
            node.children[int(tok[0])] = child
            node = child
        return node, node.n

    def _mark(self, node: Node, off: int, call: int, kind: int) -> None:
        node.markers.setdefault(off, []).append((call, kind))
        if kind == FULL_END and (node.first_full_end is None or off < node.first_full_end):
            node.first_full_end = off
        (self.prompt_node if kind == PROMPT_END else self.end_node)[call] = node

    def insert(self, ci: int, call: CallTokens) -> tuple[int | None, bool, int]:
        """Insert one call; returns (earlier call whose prompt it re-sends, extends-earlier, new-from depth)."""
        p, o = call.prompt_ids, call.output_ids
        node, off, i, mismatch = self._descend(self.root, 0, p, 0)
        if mismatch and node._trn[off]:
            self.contradictions.append(ci)
        new_from = node.start_depth + off
        extends = self._passes_full_end(node, off)
        if i < len(p):
            rest = len(p) - i
            node, off = self._attach(node, off, p[i:], np.zeros(rest, np.float32), np.full(rest, ci, np.int32),
                                     np.zeros(rest, np.bool_))
        earlier = [c for c, k in node.markers.get(off, ()) if k == PROMPT_END]
        resent = earlier[-1] if earlier else None
        self._mark(node, off, ci, PROMPT_END)
        node, off, j, _ = self._descend(node, off, o, 0)
        if j < len(o):
            rest = len(o) - j
            node, off = self._attach(node, off, o[j:], call.logprobs[j:], np.full(rest, ci, np.int32),
                                     np.ones(rest, np.bool_))
        self._mark(node, off, ci, FULL_END)
        return resent, extends, new_from

    def _passes_full_end(self, node: Node, off: int) -> bool:
        """Does the path up to (node, off) contain the end of an earlier call's full sequence?"""
        if node.first_full_end is not None and node.first_full_end <= off:
            return True
        up = node.parent
        while up is not None:
            if up.first_full_end is not None:
                return True
            up = up.parent
        return False


def _first_full_end(node: Node) -> int | None:
    offsets = [off for off, ms in node.markers.items() if any(k == FULL_END for _, k in ms)]
    return min(offsets) if offsets else None


def build_tree(calls: list[CallTokens]) -> TrajectoryTree:
    """The prefix-sharing tree of ONE execution's calls, inserted in start order."""
    if not calls:
        raise CallInputError("an execution with no calls has no trajectory tree")
    execution_ids = {c.execution_id for c in calls}
    if len(execution_ids) != 1:
        raise CallInputError(f"build_tree takes one execution's calls, got {sorted(execution_ids)}")
    for call in calls:
        check_call(call)
    ordered = [c for _, c in sorted(enumerate(calls), key=lambda ic: (ic[1].started_at, ic[0]))]
    builder = _Builder(ordered[0].execution_id, ordered)
    retried_by: dict[int, int] = {}
    extends_earlier: list[bool] = []
    new_from: list[int] = []
    for ci, call in enumerate(ordered):
        resent, extends, depth = builder.insert(ci, call)
        if resent is not None:
            retried_by[resent] = ci
        extends_earlier.append(extends)
        new_from.append(depth)
    for node in builder.nodes:
        node.num_trainable = int(np.count_nonzero(node.trainable))
    tree = TrajectoryTree(
        execution_id=builder.execution_id, calls=ordered, root=builder.root, nodes=builder.nodes,
        prompt_node=builder.prompt_node, end_node=builder.end_node, retried_by=retried_by,
        extends_earlier=extends_earlier, new_from=new_from, contradictions=builder.contradictions,
    )
    tree.trajectories = _trajectories(tree)
    return tree


def _trajectories(tree: TrajectoryTree) -> list[Trajectory]:
    """One trajectory per leaf, in the order the leaves were created."""
    trajectories = []
    for leaf in tree.nodes:
        if leaf.children:
            continue
        path, node = [], leaf
        while node is not tree.root:
            path.append(node)
            node = node.parent
        path.reverse()
        calls = sorted(c for n in path for ms in n.markers.values() for c, k in ms if k == FULL_END)
        leaf_call = max(c for c, k in leaf.markers[leaf.n] if k == FULL_END)
        trajectories.append(Trajectory(leaf, path, calls, leaf_call, retried=leaf_call in tree.retried_by))
    return trajectories
