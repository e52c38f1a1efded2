import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from guestagent.agent.on_first_use import OnFirstUse
from guestagent.errors import Unavailable


def test_nothing_is_built_until_the_first_call() -> None:
    builds: list[object] = []

    def build() -> object:
        builds.append(object())
        return builds[-1]

    part = OnFirstUse(build, "the part")
    assert part.built is None and builds == []
    first = part()
    assert part.built is first and part() is first and len(builds) == 1


def test_threads_that_ask_at_once_get_the_one_part() -> None:
    started = threading.Barrier(8)
    builds: list[object] = []

    def build() -> object:
        builds.append(object())
        time.sleep(0.05)  # Long enough that, unlocked, every thread would build its own.
        return builds[-1]

    part = OnFirstUse(build, "the part")

    def ask(_: int) -> object:
        started.wait()
        return part()

    with ThreadPoolExecutor(8) as pool:
        got = set(map(id, pool.map(ask, range(8))))
    assert len(builds) == 1 and got == {id(builds[0])}


def test_a_build_that_fails_is_tried_again_at_the_next_call() -> None:
    attempts: list[int] = []

    def build() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise OSError("not yet")
        return "part"

    part = OnFirstUse(build, "the part")
    with pytest.raises(OSError):
        part()
    assert part.built is None
    assert part() == "part" and len(attempts) == 2


def test_close_waits_for_a_build_under_way_and_then_builds_nothing() -> None:
    building, finish = threading.Event(), threading.Event()

    def build() -> str:
        building.set()
        finish.wait(5)
        return "part"

    part = OnFirstUse(build, "the reclaimer")
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(part)
        assert building.wait(5)
        closing = pool.submit(part.close)
        time.sleep(0.05)
        assert not closing.done()  # Stopping waits for the build a last call started...
        finish.set()
        assert closing.result(5) == "part" and first.result(5) == "part"  # ...and gets it.
    assert part() == "part"  # Built before the close: still served.


def test_after_close_a_part_never_built_is_refused_as_the_agent_stopping() -> None:
    builds: list[int] = []
    part = OnFirstUse(lambda: builds.append(1), "the reclaimer")
    assert part.close() is None
    with pytest.raises(Unavailable, match="the agent is stopping: the reclaimer") as refused:
        part()
    assert refused.value.reason == "AGENT_STOPPING" and builds == []
