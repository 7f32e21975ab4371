"""Gradient reduction across processes (`gyre.cluster.grad_reduce`, `gyre.cluster.train_replica`):
satellites' replicas in processes of their own sum their gradients onto the core, equal to
one replica training every row; a member dying mid-reduction leaves the core untouched and
the survivors reduce again."""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path

import numpy as np
import pytest
import torch

from gyre.algo.gspo import GSPO
from gyre.cluster import grad_reduce
from gyre.engines.torch.train import TorchTrainEngine, _collate, token_logprobs
from gyre.trajectories.rows import TrainSequence

LR = 1e-3
WAIT_S = 120.0  # spawned ranks load a model and meet over loopback; generous for a loaded box


def _rows(model_dir: Path, n_rows: int) -> list[TrainSequence]:
    """Rows with behaviour log-probs near the policy's (GSPO passes gradient on every token)."""
    rng = np.random.default_rng(3)
    ref = TorchTrainEngine(model_dir, lr=LR)
    rows = []
    for i in range(n_rows):
        n = 10 + 3 * i
        tr = np.zeros(n, np.bool_)
        tr[n // 3:] = True
        seq = TrainSequence(tokens=rng.integers(3, 500, n), trainable=tr, behaviour_logprobs=np.zeros(n),
                            weights=tr * np.float32(0.05), advantage=(-1.0) ** i * (0.5 + i / 4),
                            execution_id=f"e{i}")
        with torch.no_grad():
            cols = _collate([seq], ref.pad_id, ref.tree_attention)
            paths = cols.pop("gyre_paths", None)
            logp = token_logprobs(ref.model, cols["input_ids"], cols["attention"], 1.0, cols.get("position_ids"),
                                  cols.get("prev"), **({"gyre_paths": paths} if paths else {}))[0].numpy()
        seq.behaviour_logprobs = np.where(tr, logp + rng.normal(0, 1e-3, n), 0.0)
        rows.append(seq)
    return rows


def _config(model_dir: Path, tmp: Path) -> dict:
    return {"name": "reduce", "model": {"path": str(model_dir)}, "cache_dir": str(tmp / "cache")}


def _satellite(rank: int, port: int, config: dict, model_dir: str, rows, attempts: list[tuple[str, int]],
               die_in: str | None, out: str) -> None:
    """One satellite: train its rows on a replica, then take part in each reduction attempt
    (prefix, size); with `die_in` it joins that attempt's group and dies there (kill -9)."""
    from gyre.cluster.train_replica import ReplicaHost

    try:
        torch.set_num_threads(1)
        host = ReplicaHost(config, model_dir, seed=rank)
        host.load(TorchTrainEngine(Path(model_dir), lr=LR).model.state_dict(), 0)
        assert not isinstance(host.micro_step(100 + rank, 0, rows), str)
        for prefix, size in attempts:
            if prefix == die_in:
                store = grad_reduce.client_store("127.0.0.1", port)
                assert grad_reduce.answer(store, prefix, rank, ready=True)
                grad_reduce.join(store, prefix, rank, size, "127.0.0.1", torch.device("cpu"))
                os._exit(9)
            try:
                held = host.reduce("127.0.0.1", port, prefix, rank, size, "127.0.0.1")
                Path(out + f".held{rank}").write_text(repr(held))
            except RuntimeError:  # a peer died in this attempt: the next one goes without it
                continue
    except BaseException:
        Path(out + f".err{rank}").write_text(traceback.format_exc())
        raise


def _spawn(fn, args_by_rank: dict[int, tuple]):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=fn, args=(rank, *args)) for rank, args in args_by_rank.items()]
    for p in procs:
        p.start()
    return procs


def _join(procs) -> None:
    deadline = time.monotonic() + WAIT_S
    try:
        for p in procs:
            p.join(timeout=max(0.1, deadline - time.monotonic()))
        assert not any(p.is_alive() for p in procs), f"satellites did not finish in {WAIT_S} s"
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()


def _go(store: grad_reduce.GradStore, prefix: str, ranks: list[int]) -> None:
    """The core's roll call: wait until every member answered ready, then say go."""
    deadline = time.monotonic() + WAIT_S
    while len(answers := store.answers(prefix, ranks)) < len(ranks):
        assert time.monotonic() < deadline, f"the roll call got {answers} in {WAIT_S} s"
        time.sleep(0.02)
    assert set(answers.values()) == {"ready"}, answers
    store.decide(prefix, go=True)


def _grads(engine: TorchTrainEngine) -> dict[str, torch.Tensor]:
    return {n: p.grad.detach().clone() for n, p in engine.model.named_parameters() if p.grad is not None}


@pytest.mark.slow
def test_two_satellites_in_their_own_processes_reduce_onto_the_core_like_one_replica(tiny_model_dir, tmp_path):
    rows = _rows(tiny_model_dir, 6)
    reference = TorchTrainEngine(tiny_model_dir, lr=LR)
    for part in (rows[0:2], rows[2:4], rows[4:6]):  # three micro-steps, accumulated on one replica
        reference.forward_backward(part, GSPO().loss, accumulate=True)
    expected = _grads(reference)

    store = grad_reduce.GradStore()
    prefix = store.next_prefix(0)
    out = str(tmp_path / "sat")
    config = _config(tiny_model_dir, tmp_path)
    procs = _spawn(_satellite, {
        1: (store.port, config, str(tiny_model_dir), rows[2:4], [(prefix, 3)], None, out),
        2: (store.port, config, str(tiny_model_dir), rows[4:6], [(prefix, 3)], None, out),
    })  # fmt: skip
    core = TorchTrainEngine(tiny_model_dir, lr=LR)
    core.forward_backward(rows[0:2], GSPO().loss, accumulate=True)
    params = list(core.model.parameters())
    _go(store, prefix, [1, 2])
    group = grad_reduce.join(store.store, prefix, 0, 3, "127.0.0.1", torch.device("cpu"))
    grad_reduce.add_sum(grad_reduce.receive_sum(group, params))
    _join(procs)
    errors = [p.read_text() for p in tmp_path.glob("sat.err*")]
    assert not errors, errors[0]
    assert [(tmp_path / f"sat.held{r}").read_text() for r in (1, 2)] == ["[101]", "[102]"]
    got = _grads(core)
    assert got.keys() == expected.keys()
    worst = max(float((got[k] - expected[k]).abs().max()) for k in expected)
    assert worst < 1e-6, worst


@pytest.mark.slow
def test_a_member_dying_mid_reduction_leaves_the_core_untouched_and_the_survivor_reduces_again(
        tiny_model_dir, tmp_path):
    rows = _rows(tiny_model_dir, 4)
    store = grad_reduce.GradStore()
    first, second = store.next_prefix(0), store.next_prefix(0)
    out = str(tmp_path / "sat")
    config = _config(tiny_model_dir, tmp_path)
    procs = _spawn(_satellite, {
        1: (store.port, config, str(tiny_model_dir), rows[2:4], [(first, 3), (second, 2)], None, out),
        2: (store.port, config, str(tiny_model_dir), rows[0:2], [(first, 3)], first, out),
    })  # fmt: skip
    core = TorchTrainEngine(tiny_model_dir, lr=LR)
    core.forward_backward(rows[0:2], GSPO().loss, accumulate=True)
    own = _grads(core)
    params = list(core.model.parameters())
    _go(store, first, [1, 2])
    with pytest.raises(RuntimeError):
        group = grad_reduce.join(store.store, first, 0, 3, "127.0.0.1", torch.device("cpu"))
        grad_reduce.add_sum(grad_reduce.receive_sum(group, params))
    group = None
    assert all(torch.equal(g, own[n]) for n, g in _grads(core).items())  # nothing half-added
    _go(store, second, [1])
    group = grad_reduce.join(store.store, second, 0, 2, "127.0.0.1", torch.device("cpu"))
    grad_reduce.add_sum(grad_reduce.receive_sum(group, params))
    _join(procs)
    errors = [p.read_text() for p in tmp_path.glob("sat.err*")]
    assert not errors, errors[0]
    assert procs[1].exitcode == 9 and (tmp_path / "sat.held1").read_text() == "[101]"
    reference = TorchTrainEngine(tiny_model_dir, lr=LR)
    for part in (rows[0:2], rows[2:4]):
        reference.forward_backward(part, GSPO().loss, accumulate=True)
    expected = _grads(reference)
    worst = max(float((g - expected[n]).abs().max()) for n, g in _grads(core).items())
    assert worst < 1e-6, worst


def test_a_replica_holding_nothing_declines_the_roll_call_without_building_a_model(tiny_model_dir, tmp_path):
    from gyre.cluster.train_replica import ReplicaHost

    store = grad_reduce.GradStore()
    prefix = store.next_prefix(4)
    host = ReplicaHost(_config(tiny_model_dir, tmp_path), str(tiny_model_dir), seed=0)  # a restarted process
    assert host.reduce("127.0.0.1", store.port, prefix, 1, 2, "127.0.0.1") == []
    assert store.answers(prefix, [1]) == {1: "declined"} and host.engine is None
