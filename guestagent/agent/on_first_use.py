"""A part of the agent built when it is first used, so the modules behind it load then and not
at start: the swap manager (device-mapper's ioctls, libudev, mkswap and the disk probes) and
the working-set reclaimer. A guest that never asks for either never holds their code.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Generic, TypeVar

from guestagent.errors import Unavailable

T = TypeVar("T")


class OnFirstUse(Generic[T]):
    """Calling it returns the part, built on the first call (once, whichever thread asks);
    after close(), a part not yet built is never built."""

    def __init__(self, build: Callable[[], T], what: str) -> None:
        self._build = build
        self._what = what
        self._part: T | None = None
        self._lock = threading.Lock()
        self._closed = False

    def __call__(self) -> T:
        part = self._part
        if part is None:
            with self._lock:
                if self._part is None:
                    if self._closed:
                        raise Unavailable(
                            f"the agent is stopping: {self._what} was not in use and is not "
                            "started now; call again once the agent serves",
                            "AGENT_STOPPING",
                        )
                    self._part = self._build()
                part = self._part
        return part

    @property
    def built(self) -> T | None:
        """The part if anything has used it yet; else None, and nothing it could tell."""
        return self._part

    def close(self) -> T | None:
        """Build nothing from now on; the part if it was built, after waiting for a build
        under way, so whoever stops the agent stops a part a last call was building."""
        with self._lock:
            self._closed = True
            return self._part
