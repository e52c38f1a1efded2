import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from guestagent.on_first_use import OnFirstUse


def test_nothing_is_built_until_the_first_call() -> None:
    builds: list[object] = []

    def build() -> object:
        builds.append(object())
        return builds[-1]

    part = OnFirstUse(build)
    assert part.built is None and builds == []
    first = part()
    assert part.built is first and part() is first and len(builds) == 1


def test_threads_that_ask_at_once_get_the_one_part() -> None:
    started = threading.Barrier(8)
    builds: list[object] = []

    def build() -> object:
        builds.append(object())
        return builds[-1]

    part = OnFirstUse(build)

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

    part = OnFirstUse(build)
    with pytest.raises(OSError):
        part()
    assert part.built is None
    assert part() == "part" and len(attempts) == 2
