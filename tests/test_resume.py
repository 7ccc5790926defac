"""Learners that resume (``SessionOptions.state_dir``, docs/session.md "Resuming"): a learner
killed with SIGKILL at a step and restarted under its id continues from its last save, with the
optimizer's moments, the schedule and the random generators it saved."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import gradientmail as gm
from gradientmail.digests import hex_digest
from gradientmail.mailbox import FileMailbox
from gradientmail.records import keys
from gradientmail.session.resume import LearnerState, StateFile, StateInMailbox
from gradientmail.store import RunStore, max_state_bytes
from testing.mailbox_run import create_run
from tests.resume_proc import moments_digest
from tests.run_procs import ROOT, wait_until

SAVE_EVERY = 10


def start(url: str, state_dir: Path, log: Path, steps: int = 200) -> subprocess.Popen[str]:
    command = [
        sys.executable, "-m", "tests.resume_proc", "--mailbox", url, "--learner-id", "gpu-0",
        "--state-dir", str(state_dir), "--steps", str(steps), "--save-every", str(SAVE_EVERY),
    ]  # fmt: skip
    return subprocess.Popen(command, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT, text=True)


def events(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_a_learner_killed_mid_run_resumes_from_its_last_save_with_its_optimizer_state(tmp_path):
    """kill -9 at a step past the first saves; the restart (same id, same state_dir) opens at
    the saved step (at most SAVE_EVERY steps redone), with exactly the saved Adam moments and
    learning rate, and trains to the end."""
    url, state_dir = f"file://{tmp_path / 'box'}", tmp_path / "state"
    first = start(url, state_dir, tmp_path / "first.log")
    try:
        wait_until(lambda: any(e.get("total_steps", 0) >= 37 for e in events(tmp_path / "first.log")), 120, "37 steps")
        first.kill()
        first.wait()
    finally:
        if first.poll() is None:
            first.kill()
    reached = max(e["total_steps"] for e in events(tmp_path / "first.log") if e["event"] == "step")
    saved = torch.load(state_dir / "gpu-0.state", weights_only=True)
    # the kill may land after a step's save and before that step's line is printed: reached + 1
    assert reached - SAVE_EVERY <= saved["total_steps"] <= reached + 1 and saved["total_steps"] % SAVE_EVERY == 0
    model = torch.nn.Linear(8, 4)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    optimizer.load_state_dict(saved["objects"][0])
    expected = moments_digest(optimizer)

    second = start(url, state_dir, tmp_path / "second.log")
    assert second.wait(timeout=180) == 0, (tmp_path / "second.log").read_text()[-3000:]
    opened = next(e for e in events(tmp_path / "second.log") if e["event"] == "opened")
    assert opened["total_steps"] == saved["total_steps"]
    assert opened["moments"] == expected
    assert opened["lr"] == saved["objects"][1]["_last_lr"][0]
    closed = next(e for e in events(tmp_path / "second.log") if e["event"] == "closed")
    assert closed["total_steps"] == 200
    assert torch.load(state_dir / "gpu-0.state", weights_only=True)["total_steps"] == 200  # saved at the clean close


@pytest.mark.parametrize("where", ["directory", "mailbox", "mailbox, compressed"])
def test_the_random_generators_and_step_count_come_back_after_a_clean_close(tmp_path, where):
    """A session closed cleanly saves its state (in a directory, or with ``state_dir="mailbox"``
    under the learner's prefix in the run's mailbox, compressed in a run with
    ``payload_compression="zstd"``); the next one with the same id resumes: the step count
    continues and the next random numbers are those the first session would have drawn."""
    state_dir = str(tmp_path / "state") if where == "directory" else "mailbox"
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.05, state_dir=state_dir, save_state_every=5)
    mailbox = f"file://{tmp_path / 'box'}"
    algorithm = gm.DiLoCo(sync_every=5, fragments=1, payload_compression="zstd" if "compressed" in where else "none")

    def session() -> gm.Session:
        model = {"w": torch.zeros(3).numpy()}
        return gm.Session(model, algorithm=algorithm, mailbox=mailbox, learner_id="a", options=options)

    with session() as first:
        for _ in range(7):
            first.step()
    state = torch.get_rng_state()
    after_close = torch.rand(3)
    torch.set_rng_state(state)
    torch.manual_seed(123)  # the process moves on: a restart would not have this state
    if where != "directory":
        record = RunStore(FileMailbox(tmp_path / "box")).states.read_record("a")
        assert record is not None
        assert record.state.encoding == ("zstd-shuffle" if "compressed" in where else None)
    with session() as second:
        assert second.steps_before == 7 and second.total_steps == 7
        assert torch.equal(torch.rand(3), after_close)
        second.step()
        assert second.total_steps == 8


def test_a_state_saved_in_another_run_is_ignored(tmp_path, caplog):
    state = LearnerState(StateFile(tmp_path, "a"), "a")
    state.save("run-1", 50, [])
    assert state.load("run-1")["total_steps"] == 50
    with caplog.at_level("WARNING"):
        assert state.load("run-2") is None
    assert "saved in run run-1" in caplog.text


def test_only_objects_with_state_dicts_can_be_registered(tmp_path):
    session = gm.Session({"w": torch.zeros(2).numpy()}, mailbox=f"file://{tmp_path}", learner_id="a")
    with pytest.raises(gm.InvalidConfig, match="state_dict"):
        session.register_for_checkpointing(object())
    with pytest.raises(gm.InvalidConfig, match="save_state_every"):
        gm.SessionOptions(save_state_every=0)


def test_the_state_file_is_replaced_atomically(tmp_path):
    """A save writes a temporary file and renames it: the previous state stays whole until then."""
    state = LearnerState(StateFile(tmp_path, "a"), "a")
    state.save("r", 10, [])
    before = (tmp_path / "a.state").read_bytes()
    state.save("r", 20, [])
    assert (tmp_path / "a.state").read_bytes() != before
    assert [p.name for p in tmp_path.iterdir()] == ["a.state"]
    assert time.time() - (tmp_path / "a.state").stat().st_mtime < 60


def test_a_state_in_the_mailbox_keeps_two_saves_and_nothing_dropped_there_stops_a_learner(tmp_path, caplog):
    """``state_dir="mailbox"``: each save writes a new blob, then the record naming it, then
    deletes the older blobs but the one before (what contributions since name). A record that
    is garbage, names another learner's blob, or (in a signed run) is not signed is ignored
    with a warning: the learner starts fresh."""
    box = FileMailbox(tmp_path / "box")
    state = LearnerState(StateInMailbox(RunStore(box), "a"), "a")
    for steps in (10, 20, 30):
        state.save("r", steps, [])
    assert state.load("r")["total_steps"] == 30
    blobs = [k for k in box.list(keys.learner_state_prefix("a")) if k.endswith(".state")]
    assert len(blobs) == 2 and "000000000020-" in blobs[0] and "000000000030-" in blobs[1]

    LearnerState(StateInMailbox(RunStore(box), "b"), "b").save("r", 5, [])
    foreign = box.get(keys.learner_state_record("b"))
    box.put(keys.learner_state_record("a"), foreign.replace(b'"learner":"b"', b'"learner":"a"'))
    with caplog.at_level("WARNING"):
        assert state.load("r") is None  # it names b's blob
        box.put(keys.learner_state_record("a"), b"\x00 not a record")
        assert state.load("r") is None
    assert caplog.text.count("ignoring the saved state of a") == 2

    signed = LearnerState(StateInMailbox(RunStore(box, gm.RunKey("k" * 32)), "b"), "b")
    with caplog.at_level("WARNING"):
        assert signed.load("r") is None  # b's record is unsigned
    assert "ignoring the saved state of b" in caplog.text


def test_a_replayed_older_state_record_and_blob_are_not_resumed_from(tmp_path, caplog):
    """Issue 43, case 3: a bucket writer without the run key keeps a learner's signed state
    record and blob of step 5 and puts both back after the learner saved later ones. The
    learner's contributions (create-once, signed) name its newest save, so the restart resumes
    from the newer save they name, with a warning, not from step 5."""
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.05, state_dir="mailbox", save_state_every=5)
    box = FileMailbox(tmp_path / "box")
    algorithm = gm.DiLoCo(sync_every=5, fragments=1)

    def session() -> gm.Session:
        model = {"w": torch.zeros(3).numpy()}
        return gm.Session(model, algorithm=algorithm, mailbox=box.url, learner_id="a", options=options, run_key="k" * 32)

    with session() as first:
        for _ in range(5):
            first.step()
        record_key = keys.learner_state_record("a")
        old_record = box.get(record_key)
        old_blob_key = json.loads(old_record)["state"]["key"]
        old_blob = box.get(old_blob_key)
        for _ in range(7):
            first.step()
    box.put(record_key, old_record)
    box.put(old_blob_key, old_blob)
    with caplog.at_level("WARNING"), session() as second:
        assert second.steps_before in (10, 12), second.steps_before
    assert "its contributions name a save at step" in caplog.text


class _Moments:
    """A registered object whose state is ``mib`` MiB of fp32 (an optimizer's moments)."""

    def __init__(self, mib: int) -> None:
        self.tensor = torch.ones(mib * 2**18)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"t": self.tensor}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.tensor = state["t"]


def test_a_state_past_the_slack_loads_as_the_session_opens_before_it_holds_the_spec(tmp_path):
    """The bound is the run's model's (read from the mailbox's manifest when the session does not
    hold the spec yet, as when it resumes while opening), not the 64 MiB slack alone."""
    run = create_run(FileMailbox(tmp_path / "box"), model={"w": (100_000,)})
    assert max_state_bytes(0) < 66 * 2**20 < max_state_bytes(run.spec.model_bytes)
    LearnerState(StateInMailbox(run.store, "a"), "a").save("r", 10, [_Moments(66)])
    state = LearnerState(StateInMailbox(RunStore(run.box), "a"), "a").load("r")
    assert state is not None and state["total_steps"] == 10


def _forged_state(box: FileMailbox, learner: str, **state: object) -> None:
    """Rewrite ``learner``'s (unsigned) state record with these ``state`` fields, as a writer
    with bucket access and no run key can."""
    record = json.loads(box.get(keys.learner_state_record(learner)))
    record["state"].update(state)
    box.put(keys.learner_state_record(learner), json.dumps(record).encode())


@pytest.mark.parametrize("declared", [2**30, 2**45])
def test_a_state_record_declaring_more_than_the_run_allows_is_refused_before_any_allocation(tmp_path, caplog, declared):
    """Issue "Trust round 3", cases 4 and 5: a record declaring 2^30 raw bytes over 64 bytes of
    Blosc frame headers (each frame claiming 256 MiB) cost 1 GB of memory before its refusal,
    and 2^45 escaped as ``MemoryError``. The declared size is now held to the bound for the
    run's model before the blob is fetched: refused, logged, the learner starts fresh."""
    import tracemalloc

    box = FileMailbox(tmp_path / "box")
    state = LearnerState(StateInMailbox(RunStore(box), "a"), "a")
    state.save("r", 10, [])
    lying = b"".join(struct.pack("<BBBBIII", 2, 1, 0x21, 4, 2**28, 2**28, 16) for _ in range(4))
    blob = keys.learner_state_blob("a", 20, "0badc0de")
    box.put(blob, lying)
    _forged_state(box, "a", key=blob, size_bytes=declared, encoding="zstd-shuffle", stored_bytes=len(lying))
    tracemalloc.start()
    try:
        with caplog.at_level("WARNING"):
            assert state.load("r") is None
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * 2**20, f"{peak} bytes allocated refusing a {declared}-byte claim"
    assert f"declares {declared} bytes, more than the {max_state_bytes(0)}" in caplog.text


def test_a_state_blob_that_is_not_a_state_starts_the_learner_fresh_but_a_local_file_is_an_error(tmp_path, caplog):
    """A blob whose record pins it (right size and digest) but which is not a learner state
    (an unsigned run's writer put both) is ignored with a warning; the same bytes in the
    learner's own ``state_dir`` file stop it with an ``InvalidConfig`` naming the file."""
    box = FileMailbox(tmp_path / "box")
    state = LearnerState(StateInMailbox(RunStore(box), "a"), "a")
    state.save("r", 10, [])
    junk = b"not a torch archive" * 10
    blob = keys.learner_state_blob("a", 20, "0badc0de")
    box.put(blob, junk)
    _forged_state(box, "a", key=blob, size_bytes=len(junk), blake3=hex_digest("blake3", junk))  # no run: a new run's digest
    with caplog.at_level("WARNING"):
        assert state.load("r") is None
    assert "ignoring the saved state of a: the mailbox" in caplog.text

    (tmp_path / "dir").mkdir()
    (tmp_path / "dir" / "a.state").write_bytes(junk)
    with pytest.raises(gm.InvalidConfig, match="a.state does not load as a learner state"):
        LearnerState(StateFile(tmp_path / "dir", "a"), "a").load("r")


class _Big:
    """A registered object whose state is larger than a state in the mailbox may be."""

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"buffer": torch.zeros(max_state_bytes(0) // 4 + 1024)}

    def load_state_dict(self, state: object) -> None:
        pass


def test_a_save_larger_than_the_bound_is_refused_when_it_is_written(tmp_path):
    """The bound a reader holds a state to is told to the writer at its save, not at the restart
    that would ignore it."""
    state = LearnerState(StateInMailbox(RunStore(FileMailbox(tmp_path / "box")), "a"), "a")
    with pytest.raises(gm.InvalidConfig, match="more than the .* a state in the mailbox may hold"):
        state.save("r", 10, [_Big()])
