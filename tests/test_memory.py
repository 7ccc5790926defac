"""``gm.retain_freed_memory``: a buffer freed and allocated again at the same size faults in no page.

Each case runs in a process of its own (the setting is process-wide and cannot be undone), and
counts the minor page faults of allocating, touching and freeing a 64 MiB buffer four times, then
a 96 MiB one on each of three threads in turn: glibc maps such a buffer afresh on every
allocation, so without the setting every page faults every time; with it, only the first does.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the setting applies to glibc only")

_FAULTS = """
import json, resource, sys, threading
import gradientmail as gm
applied = [gm.retain_freed_memory(), gm.retain_freed_memory()] if sys.argv[1] == "retain" else []
def faults(size):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    buffer = bytearray(size)  # written whole: every page touched
    del buffer
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
on_threads = []
def on_a_thread():  # a thread's buffer larger than a thread arena's 64 MiB heap
    on_threads.append(faults(96 << 20))
for _ in range(3):
    thread = threading.Thread(target=on_a_thread)
    thread.start()
    thread.join()
print(json.dumps({"applied": applied, "faults": [faults(64 << 20) for _ in range(4)], "threads": on_threads}))
"""

PAGES = (64 << 20) // 4096


def _run(mode: str) -> dict[str, list[int] | list[bool]]:
    done = subprocess.run([sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, timeout=120, check=True)
    result: dict[str, list[int] | list[bool]] = json.loads(done.stdout.splitlines()[-1])
    return result


def test_a_freed_buffer_is_reused_without_faulting_its_pages_in_again() -> None:
    default, retained = _run("default"), _run("retain")
    # without the setting, every allocation of the buffer faults its pages in afresh
    assert all(count >= PAGES // 2 for count in default["faults"]), default
    # with it, the later allocations reuse the pages of the first (or of memory freed before)
    assert retained["applied"] == [True, True]
    assert all(count < PAGES // 20 for count in retained["faults"][1:]), retained
    # and so does a buffer allocated on another thread, each time on a new one
    assert all(count >= PAGES for count in default["threads"]), default
    assert all(count < PAGES // 20 for count in retained["threads"][1:]), retained
