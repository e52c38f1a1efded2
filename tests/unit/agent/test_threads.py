"""The idle-exiting pool: its threads end when idle, and no work is ever left without one."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from pathlib import Path

import pytest

from guestagent.agent.threads import IdleExitPool


def wait_for(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.01)


def test_threads_start_with_work_and_end_when_idle() -> None:
    pool = IdleExitPool(2, "t", idle_seconds=0.2)
    assert pool.live_threads == 0
    together = threading.Barrier(2)
    futures = [pool.submit(together.wait, 5) for _ in range(2)]
    assert {f.result(5) for f in futures} == {0, 1}  # Both ran at once: two threads.
    wait_for(lambda: pool.live_threads == 0)
    # Work after every thread ended still runs.
    assert pool.submit(lambda: 42).result(5) == 42
    pool.shutdown()


def own_comm() -> str:
    return Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text().strip()


def test_each_thread_carries_its_name_in_proc() -> None:
    # Python 3.11 names no native thread: without this every pool thread shows as the agent.
    pool = IdleExitPool(1, "blocking", idle_seconds=5)
    assert pool.submit(own_comm).result(5) == "blocking_1"
    pool.shutdown()


def test_at_most_max_workers_threads() -> None:
    pool = IdleExitPool(2, "t", idle_seconds=5)
    gate = threading.Event()
    futures = [pool.submit(gate.wait, 5) for _ in range(6)]
    assert pool.live_threads == 2
    gate.set()
    assert all(f.result(5) for f in futures)
    pool.shutdown()
    assert pool.live_threads == 0


def test_no_work_is_stranded_when_threads_end_as_it_arrives() -> None:
    # Idle times so short that threads keep ending while others submit: every future finishes.
    pool = IdleExitPool(2, "t", idle_seconds=0.001)
    rng = random.Random(7)
    results: list[int] = []

    def submitter(base: int) -> None:
        for i in range(300):
            results.append(pool.submit(lambda n: n * 2, base + i).result(5))
            if rng.random() < 0.1:
                time.sleep(0.002)

    submitters = [threading.Thread(target=submitter, args=(k * 1000,)) for k in range(3)]
    for t in submitters:
        t.start()
    for t in submitters:
        t.join()
    assert sorted(results) == sorted(2 * (k * 1000 + i) for k in range(3) for i in range(300))
    pool.shutdown()


def test_exceptions_reach_the_caller() -> None:
    pool = IdleExitPool(1, "t")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        pool.submit(fail).result(5)
    pool.shutdown()


def test_shutdown_refuses_new_work_and_cancels_queued() -> None:
    pool = IdleExitPool(1, "t")
    gate = threading.Event()
    running = pool.submit(gate.wait, 5)
    queued = pool.submit(lambda: 1)
    threading.Timer(0.1, gate.set).start()
    pool.shutdown(cancel_futures=True)
    assert running.result() is True
    assert queued.cancelled()
    with pytest.raises(RuntimeError):
        pool.submit(lambda: 1)


def test_serves_as_asyncio_default_executor() -> None:
    async def main() -> int:
        asyncio.get_running_loop().set_default_executor(IdleExitPool(2, "blocking"))
        return await asyncio.to_thread(lambda: 3)

    assert asyncio.run(main()) == 3


def test_the_last_thread_to_end_calls_after_burst() -> None:
    ends: list[int] = []
    pool = IdleExitPool(2, "t", idle_seconds=0.1, after_burst=lambda: ends.append(1))
    together = threading.Barrier(2)
    for f in [pool.submit(together.wait, 5) for _ in range(2)]:
        f.result(5)
    wait_for(lambda: pool.live_threads == 0)
    wait_for(lambda: ends == [1])  # Two threads ended; one burst.
    pool.submit(lambda: 0).result(5)
    wait_for(lambda: ends == [1, 1])
    pool.shutdown()
