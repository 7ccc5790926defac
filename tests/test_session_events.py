"""What a session tells its listeners (``session/events.py``): the scalars the training loop
reports, each contribution it publishes and each commit it aligns with; a listener that raises
does not stop training; bad scalars are refused by name."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.session.events import REPORTED_NAMES_LIMIT


def _session(tmp_path, learner: str = "a") -> tuple[gm.Session, dict[str, np.ndarray]]:
    model = {"w": np.zeros(8, np.float32)}
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.02)
    session = gm.Session(
        model,
        algorithm=gm.DiLoCo(sync_every=4, fragments=1),
        mailbox=f"file://{tmp_path / 'box'}",
        learner_id=learner,
        options=options,
    )
    return session, model


def test_listeners_see_reports_publishes_and_alignments_in_order(tmp_path):
    session, model = _session(tmp_path)
    events: list[gm.SessionEvent] = []
    session.add_listener(events.append)
    with session:
        for step in range(12):
            model["w"] += 0.1
            session.step(samples=2)
            session.report(loss=1.0 / (step + 1), lr=np.float32(0.5))  # a NumPy scalar is a number too
            if step % 4 == 3:
                session.wait_published()
    reported = [e for e in events if e.kind == "reported"]
    assert len(reported) == 12 and reported[-1].scalars == {"loss": 1.0 / 12, "lr": 0.5} and reported[-1].step == 12
    published = [e for e in events if e.kind == "published"]
    aligned = [e for e in events if e.kind == "aligned"]
    assert published and all(e.fragment == 0 and e.version is not None for e in published)
    assert aligned and [e.version for e in aligned] == sorted(e.version for e in aligned)
    assert session.reported.values == {"loss": 1.0 / 12, "lr": 0.5}


def test_a_listener_that_raises_is_logged_and_training_goes_on(tmp_path, caplog):
    session, model = _session(tmp_path)
    calls: list[str] = []

    def broken(event: gm.SessionEvent) -> None:
        calls.append(event.kind)
        raise RuntimeError("tracker offline")

    session.add_listener(broken)
    with caplog.at_level(logging.WARNING), session:
        for _ in range(6):
            model["w"] += 0.1
            session.step()
            session.report(loss=0.5)
    assert session.stats.steps == 6 and calls.count("reported") == 6
    assert caplog.text.count("tracker offline") == 1  # once, not once per event


def test_bad_scalars_are_refused_by_name(tmp_path):
    session, _ = _session(tmp_path)
    with pytest.raises(gm.InvalidConfig, match="scalar name '1st'"):
        session.report(**{"1st": 1.0})
    with pytest.raises(gm.InvalidConfig, match="loss: a number, got str"):
        session.report(loss="low")  # type: ignore[arg-type]
    session.report(**{f"s{i}": float(i) for i in range(REPORTED_NAMES_LIMIT)})
    session.report(s0=2.0)  # a known name again is fine
    with pytest.raises(gm.InvalidConfig, match=f"at most {REPORTED_NAMES_LIMIT} scalar names"):
        session.report(one_more=1.0)
    with pytest.raises(gm.InvalidConfig, match="callable"):
        session.add_listener("print")  # type: ignore[arg-type]
