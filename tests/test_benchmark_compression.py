"""benchmarks/compression.py runs end to end on a tiny model: every codec round-trips every form
(it asserts so itself) and the result names each form and codec with its size ratio."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import compression


@pytest.mark.slow
def test_the_compression_benchmark_round_trips_and_reports_every_form(capsys: pytest.CaptureFixture[str]) -> None:
    assert compression.main(["--width", "64", "--layers", "1", "--steps", "1", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    path = Path(out.rsplit("result: ", 1)[1].strip())
    rows = json.loads(path.read_text())["rows"]
    assert {(r["form"], r["codec"]) for r in rows} == {
        (form, codec)
        for form in compression.FORMS
        for codec in ("blosc zstd-1 shuffle", "blosc zstd-3 shuffle", "zstd-1, no shuffle")
    }
    assert all(0 < r["ratio"] < 1.05 for r in rows)
