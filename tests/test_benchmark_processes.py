"""testing/processes.py: learner processes side by side, and a hang that fails with its stacks."""

from __future__ import annotations

import sys
import time

import pytest

from testing.processes import HUNG, Hung, run_side_by_side


def test_every_process_runs_to_its_end_and_one_failure_stops_none_of_the_others(tmp_path):
    slow = [sys.executable, "-c", "import time; time.sleep(0.5); print('slow done')"]
    failing = [sys.executable, "-c", "import sys; print('to stderr', file=sys.stderr); sys.exit(3)"]
    done = run_side_by_side([slow, failing], timeout=60, logs=[tmp_path / "slow.log", tmp_path / "failing.log"])
    assert [d.returncode for d in done] == [0, 3]
    assert done[0].output == "slow done\n" and done[1].output == ""
    assert (tmp_path / "failing.log").read_text() == "to stderr\n"  # standard error went to its log


@pytest.mark.slow
def test_a_hang_fails_with_where_every_process_was():
    """Past the timeout every process prints its stacks (PYTHONFAULTHANDLER, SIGABRT) and the
    error carries them; nothing is left running."""
    waits = [sys.executable, "-c", "import time\ndef waits_forever():\n    time.sleep(600)\nwaits_forever()"]
    quick = [sys.executable, "-c", "print('quick done')"]
    started = time.monotonic()
    with pytest.raises(Hung) as hung:
        run_side_by_side([quick, waits], timeout=2)
    assert time.monotonic() - started < 30
    message = str(hung.value)
    assert message.startswith(HUNG) and "quick done" in message
    assert "Fatal Python error: Aborted" in message and "in waits_forever" in message
