"""The system calls through ctypes, each in a fresh interpreter: the malloc arena cap seen through
glibc's own malloc_stats(), heap trimming, huge pages refused, the open file limits."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

# Eight threads, all alive at once, each allocate past pymalloc (which serves objects up to
# 512 bytes itself), so each asks glibc for memory and gets an arena of its own unless capped.
PROGRAM = """
import ctypes, sys, threading
from guestagent.linux.syscalls import limit_malloc_arenas
if sys.argv[1] != "default":
    assert limit_malloc_arenas(int(sys.argv[1]))
held = []
together = threading.Barrier(8)
def allocate():
    held.extend(bytearray(1 << 16) for _ in range(8))
    together.wait()  # An exited thread's arena is handed to the next: keep all alive.
threads = [threading.Thread(target=allocate) for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
ctypes.CDLL(None).malloc_stats()
"""


def arenas_with(setting: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, setting],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return len(re.findall(r"^Arena \d+:", done.stderr, re.MULTILINE))


@pytest.mark.skipif(os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc only")
def test_the_arena_cap_holds_where_threads_would_each_get_one() -> None:
    # The uncapped run shows the test can see arenas multiply; the capped one that they do not.
    assert arenas_with("default") > 2
    assert arenas_with("2") == 2
    assert arenas_with("1") == 1


# Blocks of 64 KiB (under glibc's mmap threshold, so from the heap) freed all but the last:
# the freed ones sit below a live block, where free(3) alone never returns them.
TRIM_PROGRAM = """
import sys
from guestagent.linux.syscalls import give_heap_back, lock_memory
def status(field):
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith(field))
def rss_anon():
    return status("RssAnon")
if sys.argv[1] == "locked":
    lock_memory()
blocks = [bytearray(1 << 16) for _ in range(512)]
kept = blocks[-1]
del blocks
held = rss_anon()
give_heap_back()
print(held - rss_anon(), status("VmLck"))
"""


@pytest.mark.skipif(os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc only")
@pytest.mark.parametrize("memory", ["unlocked", "locked"])
def test_giving_heap_back_returns_what_free_kept(memory: str) -> None:
    """Locked too: the trim's madvise refuses locked pages, so it unlocks around the trim."""
    if memory == "locked" and os.geteuid() != 0:
        pytest.skip("mlockall past RLIMIT_MEMLOCK needs CAP_IPC_LOCK")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    done = subprocess.run(
        [sys.executable, "-c", TRIM_PROGRAM, memory],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    given_back_kib, locked_kib = map(int, done.stdout.split())
    # 32 MiB were freed; at least most of it leaves RSS.
    assert given_back_kib > 24 * 1024
    # And what it still holds is locked again (the kept block and the interpreter's pages).
    assert (locked_kib > 1024) == (memory == "locked")


def child_output(program: str) -> str:
    """What a fresh interpreter running program printed; it must exit 0."""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_huge_pages_refused_in_this_process_and_its_children() -> None:
    # In a child, so the test process keeps the kernel's default; the grandchild inherits it.
    program = (
        "import subprocess, sys\n"
        "from guestagent.linux.syscalls import huge_pages_refused, refuse_huge_pages\n"
        "assert not huge_pages_refused()\n"
        "assert refuse_huge_pages()\n"
        "assert huge_pages_refused()\n"
        "child = 'from guestagent.linux.syscalls import huge_pages_refused as r; print(r())'\n"
        "print(subprocess.run([sys.executable, '-c', child], capture_output=True, text=True,"
        " check=True).stdout.strip())\n"
    )
    assert child_output(program) == "True"


def test_the_open_file_limits_read_and_set_as_the_kernel_holds_them() -> None:
    # In a child: it lowers its own soft limit, reads it back through resource, and is refused
    # a soft limit over the hard one, as setrlimit(2) refuses it.
    program = (
        "import errno, resource\n"
        "from guestagent.linux.syscalls import nofile_limits, set_nofile_limits\n"
        "soft, hard = nofile_limits()\n"
        "assert (soft, hard) == resource.getrlimit(resource.RLIMIT_NOFILE), (soft, hard)\n"
        "set_nofile_limits(64, hard)\n"
        "assert resource.getrlimit(resource.RLIMIT_NOFILE) == (64, hard)\n"
        "assert nofile_limits() == (64, hard)\n"
        "try:\n"
        "    set_nofile_limits(hard + 1, hard)\n"
        "except OSError as e:\n"
        "    print(errno.errorcode[e.errno], e)\n"
    )
    expected = "EINVAL [Errno 22] setrlimit(RLIMIT_NOFILE): Invalid argument"
    assert child_output(program) == expected
