"""``Session.run(step, data)``: the session owns the loop; and ``gm.align(model, mailbox=...)``: an
evaluation job loads the newest committed model in one line, without joining the run."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

import gradientmail as gm
from gradientmail.store import RunStore

KEY = "k" * 40


def _model() -> dict[str, np.ndarray]:
    return {"embed": np.zeros(64, np.float32), "w": np.zeros(256, np.float32), "b": np.zeros(8, np.float32)}


def _session(model: object, box: gm.Mailbox | str, learner: str = "learner-a", key: str | None = None) -> gm.Session:
    return gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=5, fragments=2, overlap_steps=0),
        mailbox=box,
        learner_id=learner,
        run_key=key,
        options=gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.02),
    )


def _numpy_step(model: dict[str, np.ndarray]):  # type: ignore[no-untyped-def]
    def step(batch: int) -> int:
        for index, array in enumerate(model.values()):
            array -= np.float32(0.01 * (batch + index + 1))
        return 4

    return step


def _keys(box: gm.Mailbox) -> list[str]:
    return box.list("")


def test_run_trains_the_data_closes_and_returns_the_counters(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    model = _model()
    session = _session(model, box)
    stats = session.run(_numpy_step(model), range(23))
    assert (stats.steps, stats.samples) == (23, 92)
    store = RunStore(box)
    newest = [store.newest_version(f) for f in range(2)]
    assert all(v is not None and v >= 4 for v in newest), newest  # 23 steps, a round every 5
    with pytest.raises(RuntimeError, match="runs once"):
        session.run(_numpy_step(model), range(3))


def test_a_step_returning_none_counts_one_sample_and_data_can_come_from_the_open_session(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    model = _model()
    seen: list[int] = []

    def step(batch: int) -> None:
        seen.append(batch)
        model["w"] -= np.float32(0.001)

    def data(session: gm.Session) -> Iterator[int]:
        for unit in session.queue("shards", 3):
            yield from range(unit * 10, unit * 10 + 4)

    stats = _session(model, box).run(step, data)
    assert seen == [0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23]
    assert (stats.steps, stats.samples) == (12, 12)


def test_an_error_in_step_closes_the_session_without_waiting_and_propagates(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    model = _model()

    def step(batch: int) -> int:
        if batch == 7:
            raise ValueError("bad batch 7")
        return 1

    session = _session(model, box)
    with pytest.raises(ValueError, match="bad batch 7"):
        session.run(step, range(100))
    assert session.stats.steps == 7
    lease = RunStore(box).leases.read_learner("learner-a")
    assert lease is not None and lease.lease is not None and lease.lease.released  # it left the run


def test_align_loads_the_newest_commit_of_every_fragment_and_writes_nothing(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    trained = _model()
    _session(trained, box).run(_numpy_step(trained), range(17))  # closes at the newest commit
    before = _keys(box)
    fresh = _model()
    versions = gm.align(fresh, mailbox=f"file://{tmp_path / 'box'}")
    store = RunStore(box)
    assert versions == tuple(store.newest_version(f) for f in range(2))
    for name in trained:
        np.testing.assert_array_equal(fresh[name], trained[name])
    assert _keys(box) == before  # no lease, no contribution, nothing


def test_align_refuses_a_model_that_differs_naming_what_and_leaves_it_unchanged(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    trained = _model()
    _session(trained, box).run(_numpy_step(trained), range(6))
    other = {"embed": np.ones(64, np.float32), "w": np.ones(128, np.float32), "b": np.ones(8, np.float32)}
    with pytest.raises(gm.RunConfigMismatch, match=r"w: the run has shape \(256,\), this model \(128,\)"):
        gm.align(other, mailbox=box)
    assert all((array == 1).all() for array in other.values())
    with pytest.raises(gm.GradientMailError, match="no run at"):
        gm.align(_model(), mailbox=gm.FileMailbox(tmp_path / "empty"))


def test_align_reads_a_signed_run_with_the_key_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    trained = _model()
    _session(trained, box, key=KEY).run(_numpy_step(trained), range(11))
    monkeypatch.delenv("GRADIENTMAIL_RUN_KEY", raising=False)
    monkeypatch.delenv("GRADIENTMAIL_RUN_KEY_FILE", raising=False)
    with pytest.raises(gm.RunConfigMismatch, match="GRADIENTMAIL_RUN_KEY"):
        gm.align(_model(), mailbox=box)
    monkeypatch.setenv("GRADIENTMAIL_RUN_KEY", KEY)
    fresh = _model()
    gm.align(fresh, mailbox=box)
    np.testing.assert_array_equal(fresh["w"], trained["w"])


def test_align_loads_a_torch_model_from_a_torch_run(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trained = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    inputs = torch.randn(32, 16)

    def step(batch: int) -> int:
        optimizer.zero_grad()
        loss = trained(inputs[batch % 4 :: 4]).square().mean()
        loss.backward()
        optimizer.step()
        return 8

    _session(trained, f"file://{tmp_path / 'box'}").run(step, range(12))
    fresh = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Linear(8, 2))
    gm.align(fresh, mailbox=f"file://{tmp_path / 'box'}")
    for (name, got), (_, want) in zip(fresh.state_dict().items(), trained.state_dict().items(), strict=True):
        assert torch.equal(got, want), name
