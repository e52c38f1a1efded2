"""The WatchMemory feed behind `guestctl metrics`: latest report, reconnects, quiet streams."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import grpc
import pytest

from guestagent.host.metrics.feed import WatchFeed
from guestagent.host.streams import backoff_delay, quiet_limit
from guestagent.v1 import agent_pb2 as pb


class FakeRpcError(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


END = object()


class FakeStream:
    """A WatchMemory call whose messages, errors and end the test feeds in."""

    def __init__(self) -> None:
        self.items: queue.Queue[object] = queue.Queue()
        self.cancelled = threading.Event()

    def __iter__(self) -> Iterator[pb.MemoryInfo]:
        return self

    def __next__(self) -> pb.MemoryInfo:
        item = self.items.get(timeout=10)
        if item is END:
            raise StopIteration
        if isinstance(item, Exception):
            raise item
        assert isinstance(item, pb.MemoryInfo)
        return item

    def cancel(self) -> bool:
        self.cancelled.set()
        self.items.put(FakeRpcError(grpc.StatusCode.CANCELLED, "Locally cancelled"))
        return True


class FakeClient:
    target = "unix:///fake.sock"

    def __init__(self) -> None:
        self.streams: list[FakeStream] = []
        self.opened = threading.Condition()

    def watch(self, cgroups: list[str], interval_ms: int) -> FakeStream:
        stream = FakeStream()
        with self.opened:
            self.streams.append(stream)
            self.opened.notify_all()
        return stream

    def stream(self, index: int) -> FakeStream:
        with self.opened:
            assert self.opened.wait_for(lambda: len(self.streams) > index, timeout=10)
            return self.streams[index]


def wait_until(condition: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met"
        time.sleep(0.005)


def message(total_mib: int) -> pb.MemoryInfo:
    return pb.MemoryInfo(system=pb.SystemMemory(mem_total_bytes=total_mib << 20))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Harness:
    watch: WatchFeed
    client: FakeClient
    clock: Clock
    logged: list[str]

    def connected(self, index: int) -> FakeStream:
        """Stream `index`, once it has delivered a report and the feed is up."""
        stream = self.client.stream(index)
        stream.items.put(message(512))
        wait_until(lambda: self.watch.snapshot().up)
        return stream


@pytest.fixture
def feed() -> Iterator[Harness]:
    client, clock, logged = FakeClient(), Clock(), list[str]()
    watch = WatchFeed(client, ["pod"], 100, clock=clock, log=logged.append)  # type: ignore[arg-type]
    watch.start()
    yield Harness(watch, client, clock, logged)
    watch.stop()


@pytest.mark.parametrize(
    ("attempt", "delay"), [(0, 0.1), (1, 0.2), (3, 0.8), (6, 6.4), (7, 10.0), (10_000, 10.0)]
)
def test_backoff_delay(attempt: int, delay: float) -> None:
    assert backoff_delay(attempt) == pytest.approx(delay)


@pytest.mark.parametrize(("interval_ms", "limit"), [(0, 5.0), (100, 5.0), (5000, 15.0)])
def test_quiet_limit(interval_ms: int, limit: float) -> None:
    assert quiet_limit(interval_ms) == limit


def test_before_the_first_message_it_is_down(
    feed: Harness,
) -> None:
    watch, client = feed.watch, feed.client
    client.stream(0)
    snapshot = watch.snapshot()
    assert (snapshot.up, snapshot.report, snapshot.report_age_seconds) == (False, None, None)


def test_it_keeps_the_latest_report(feed: Harness) -> None:
    watch, client, clock = feed.watch, feed.client, feed.clock
    stream = client.stream(0)
    stream.items.put(message(512))
    stream.items.put(message(768))
    wait_until(lambda: watch.snapshot().report == message(768))
    clock.now += 0.5
    snapshot = watch.snapshot()
    assert snapshot.up and snapshot.reconnects == 0
    assert snapshot.report_age_seconds == pytest.approx(0.5)


def test_a_broken_stream_is_opened_again(
    feed: Harness,
) -> None:
    watch, client, logged = feed.watch, feed.client, feed.logged
    first = feed.connected(0)
    first.items.put(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "Socket closed"))
    second = client.stream(1)
    snapshot = watch.snapshot()
    assert not snapshot.up and snapshot.reconnects == 1
    assert snapshot.report == message(512)  # kept, for its age; metrics leaves it out while down
    second.items.put(message(1024))
    wait_until(lambda: watch.snapshot().up)
    assert watch.snapshot().report == message(1024)
    assert logged[0] == (
        "guestctl: metrics: stream from unix:///fake.sock: UNAVAILABLE: Socket closed; "
        "retrying in 0.1 s"
    )
    assert logged[1] == "guestctl: metrics: stream from unix:///fake.sock is back"


def test_a_stream_the_agent_ends_is_opened_again(
    feed: Harness,
) -> None:
    client, logged = feed.client, feed.logged
    client.stream(0).items.put(END)
    client.stream(1)
    assert "the agent ended the stream" in logged[0]


def test_the_same_failure_is_logged_once(
    feed: Harness,
) -> None:
    watch, client, logged = feed.watch, feed.client, feed.logged
    for index in range(3):
        client.stream(index).items.put(FakeRpcError(grpc.StatusCode.UNAVAILABLE, "refused"))
    client.stream(3)
    assert len(logged) == 1 and watch.snapshot().reconnects == 3


def test_a_quiet_stream_is_cancelled_and_opened_again(
    feed: Harness,
) -> None:
    watch, client, clock = feed.watch, feed.client, feed.clock
    first = feed.connected(0)
    clock.now += quiet_limit(100) + 0.1
    assert not watch.snapshot().up
    assert first.cancelled.is_set()
    client.stream(1)


def test_stop_cancels_the_stream_and_ends_the_thread() -> None:
    client = FakeClient()
    watch = WatchFeed(client, log=lambda line: None).start()  # type: ignore[arg-type]
    stream = client.stream(0)
    watch.stop()
    assert stream.cancelled.is_set()
    assert len(client.streams) == 1
