"""The quantization benchmark runs and reports every format, and the sparse codec, against the copy rate
(figures: docs/benchmarks-log.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quantize_benchmark_reports_every_format_and_target(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    result = subprocess.run(
        [sys.executable, "-m", "benchmarks.quantize", "--mb", "4", "--repeat", "1", "--json", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    saved = json.loads(out.read_text())
    assert {(t["format"], t["operation"]) for t in saved["targets"]} == {
        (form, op) for form in ("int8", "fp8_e4m3", "int4", "int2", "top64of4096/int2") for op in ("quantize", "dequantize")
    }
    assert all(t["median"] > 0 and t["met"] is None for t in saved["targets"])  # one run: information only
    assert all(r["threaded_copy_bytes_per_s"] > 0 and r["single_copy_bytes_per_s"] > 0 for r in saved["results"])
    assert saved["quality"]["int4"]["bytes_per_element"] == 0.5 + 4 / 128
    sparse = saved["quality"]["top64of4096/int2"]
    assert sparse["bytes_per_element"] == (2 * 64 + 64 / 4 + 4) / 4096  # offsets, 2-bit codes, a scale per chunk
    assert saved["quality"]["int2"]["relative_error"] < sparse["relative_error"] < 1
    assert saved["quality"]["int8"]["relative_error"] < saved["quality"]["int4"]["relative_error"] < 0.2
    assert "targets met" in result.stdout and "[information: 1 run, a verdict needs 3]" in result.stdout
