"""The sweep's rollout pool (orchestrator/pool.py), its bookkeeping on its own: a set is kept from run to run
of the same key, another key's idle set makes room, a released set is taken while a new one finds no room,
and a pruned run's release tells its ranks they were stopped. The engines themselves: tests/test_group.py."""

from __future__ import annotations

import threading
import time
import types

import pytest

from orchestrator import pool as pool_module
from orchestrator.pool import RolloutPool, RolloutSet, poolable, set_key
from trainables.config import RolloutConfig
from trainables.rollout.service import NoRoomError

CPU, OTHER = RolloutConfig(), RolloutConfig(num_cpus=2)


@pytest.fixture
def pool(monkeypatch):
    """A pool whose sets are plain records: `stopped` lists the sets it stopped, `rooms` says for each new
    set whether the cluster has room (True) or not (False)."""
    made = RolloutPool()
    made.stopped, made.rooms = [], []

    def start(self, key, cfg, model_path, timeout_s):
        if self.rooms and not self.rooms.pop(0):
            time.sleep(timeout_s)  # as a placement group waits for room
            raise NoRoomError("no room")
        self.started += 1
        return RolloutSet(key, f"pool-{self.started}", [types.SimpleNamespace(set=self.started)], None)

    monkeypatch.setattr(RolloutPool, "start", start)
    monkeypatch.setattr(pool_module, "stop_set", made.stopped.append)
    monkeypatch.setattr(pool_module, "ROOM_WAIT_S", 0.01)
    return made


def test_a_set_is_kept_from_run_to_run_of_the_same_model_and_engine(pool):
    first, _ = pool.acquire("a", CPU, "/m")
    assert pool.holds("a") and not pool.holds("b")
    pool.release("a")
    again, _ = pool.acquire("b", CPU, "/m")
    assert again is first and pool.sets_started() == 1
    other, _ = pool.acquire("c", CPU, "/m")  # "b" still holds the first set: a second one starts
    assert other is not first and pool.sets_started() == 2
    pool.release("b")
    pool.release("b")  # the driver's release of a pruned run after the run's own: nothing more happens
    assert len(pool.idle) == 1 and not pool.holds("b")


def test_another_key_makes_room_and_a_key_is_the_engine_not_the_sampling(pool):
    pool.acquire("a", CPU, "/m")
    pool.release("a")
    pool.acquire("b", OTHER, "/m")  # two CPUs an engine: the idle one-CPU set is stopped first
    assert [s.key for s in pool.stopped] == [set_key(CPU, "/m")] and pool.sets_started() == 2
    hotter = RolloutConfig(decoding={"ead": {"tau_max": 1.4}}, group_size=4)
    assert set_key(hotter, "/m") == set_key(CPU, "/m") != set_key(CPU, "/other-model")
    # Engines set up for one run's ranks stay that run's own.
    assert poolable(CPU) and poolable(RolloutConfig(backend="vllm", weight_transfer="gloo"))
    assert not poolable(RolloutConfig(backend="vllm", num_gpus=0.4, colocate=True))
    assert not poolable(RolloutConfig(backend="vllm", num_gpus=1, weight_transfer="nccl"))


def test_a_set_released_while_a_new_one_finds_no_room_is_taken(pool):
    first, _ = pool.acquire("pruned", CPU, "/m")
    pool.rooms = [False] * 10_000  # the pruned run's set holds the room a second set would need
    got = {}
    waiting = threading.Thread(target=lambda: got.update(set=pool.acquire("next", CPU, "/m")[0]))
    waiting.start()
    waiting.join(0.2)
    assert waiting.is_alive() and not pool.holds("next")
    pool.release("pruned")  # the driver's callback, just after the next run asked
    waiting.join(5)
    assert got["set"] is first and pool.sets_started() == 1
