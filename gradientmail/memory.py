"""Keep the memory a process frees for its next allocations (glibc), instead of handing it back.

A syncer round allocates the same large buffers every round: each contribution's payload
(one ``bytes`` per blob, 256 MB at M = 8 × 256 MB), the outer step's new parameters and momentum,
the encoded commit. glibc serves every allocation above its mmap threshold (at most 32 MiB) with
a fresh ``mmap`` and unmaps it on ``free``, so each round faults in and zeroes every page again:
on the 2-core VM of ``docs/benchmarks.md`` that was 55 % of the syncer's own CPU samples
(``clear_page_erms``) and 2–4 s per GB, where the same bytes written into memory the process
already had cost 0.02 s per 256 MB. :func:`retain_freed_memory` turns both off for the process
(``mallopt``: no mmap for chunks, no trimming of the heap, one arena for every thread, since a
thread's own arena maps its large chunks regardless), so a freed buffer stays in the process and
the next round's buffer of that size reuses it with no page fault, on whichever thread.

The price is that the process keeps its peak: what it once held stays resident until it exits
(the next round uses it again). A process whose working set repeats — a syncer, a dedicated
syncer node, a learner that publishes the same fragments every period — wants that; a process
whose peak was a one-off may not. So the library never calls it behind a user's back:
``gradientmail node`` does (``GRADIENTMAIL_RETAIN_FREED_MEMORY``, on by default), a user's own
training script may (``gm.retain_freed_memory()`` before the model is built), and
``docs/operations.md`` ("Memory") has the figures.

Elsewhere than glibc (macOS, musl) it does nothing and says so: their allocators keep no such
threshold that this could move.
"""

from __future__ import annotations

import ctypes
import logging
import threading

__all__ = ["retain_freed_memory"]

log = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8
"""``mallopt`` parameters (glibc's ``malloc.h``)."""

_lock = threading.Lock()
_retained = False


def retain_freed_memory() -> bool:
    """Make this process keep the memory it frees for its next allocations; True where that
    applies (glibc), False where it does nothing. Idempotent. Call it first thing, before the
    process starts threads: chunks mapped before the call are still unmapped when freed, and a
    thread already given an arena of its own keeps it."""
    global _retained
    with _lock:
        if _retained:
            return True
        libc = _glibc()
        if libc is None:
            log.debug("retain_freed_memory: not glibc; the allocator is left as it is")
            return False
        # mallopt returns 1 on success. M_MMAP_MAX = 0: large chunks come from the heap, where a
        # freed one is reused; M_TRIM_THRESHOLD = -1: the heap's top is never given back;
        # M_ARENA_MAX = 1: threads started from now on share the main heap, because a thread's own
        # arena maps every chunk above its 64 MiB heaps afresh whatever M_MMAP_MAX says.
        settings = ((_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, -1), (_M_ARENA_MAX, 1))
        if not all(libc.mallopt(parameter, value) == 1 for parameter, value in settings):
            log.warning("retain_freed_memory: glibc refused mallopt; the allocator is left as it is")
            return False
        _retained = True
        return True


def _glibc() -> ctypes.CDLL | None:
    """The process's C library when it is glibc (it has ``gnu_get_libc_version`` and ``mallopt``)."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # TypeError: a platform without a process-wide symbol table
        return None
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    return libc
