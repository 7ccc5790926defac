"""What telemetry costs ``session.step()``: off, on (Prometheus endpoint), and on while scraped.

Telemetry adds no code to ``step()``: learner counters are read by observable instruments when a
reader collects. This prints per-step times measured in one process, side by side, including a
run during which a thread scrapes ``/metrics`` ten times a second (the scrape runs the callbacks
and competes for the GIL, the only way "on" can show up in the training thread).
Run: python benchmarks/telemetry_overhead.py
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable

import numpy as np

import gradientmail as gm

STEPS = 200_000
REPEATS = 5


def per_step(loop: Callable[[int], None]) -> float:
    started = time.perf_counter()
    loop(STEPS)
    return (time.perf_counter() - started) / STEPS


def measure() -> dict[str, float]:
    """Best of REPEATS rounds, each measuring every variant in turn (off, on, on and scraped),
    so drift of a shared machine hits them alike."""
    model = {"w": np.zeros((64, 64), np.float32)}
    algorithm = gm.DiLoCo(sync_every=10**9)  # nothing comes due during the measurement
    options = gm.SessionOptions(run_syncer=False)
    results: dict[str, list[float]] = {}
    scrape_s: list[float] = []
    with gm.Session(model, algorithm=algorithm, mailbox=gm.MemoryMailbox(), learner_id="bench", options=options) as session:

        def empty(steps: int) -> None:
            for _ in range(steps):
                pass

        def stepping(steps: int) -> None:
            for _ in range(steps):
                session.step(samples=32)

        for _ in range(REPEATS):
            results.setdefault("empty loop", []).append(per_step(empty))
            results.setdefault("session.step(), telemetry off", []).append(per_step(stepping))
            telemetry = gm.telemetry.configure(prometheus_port=0, prometheus_address="127.0.0.1", node="bench")
            assert telemetry.prometheus_address is not None
            url = f"http://127.0.0.1:{telemetry.prometheus_address[1]}/metrics"
            results.setdefault("session.step(), telemetry on", []).append(per_step(stepping))
            stop = threading.Event()

            def scrape() -> None:
                while not stop.wait(0.1):
                    started = time.perf_counter()
                    urllib.request.urlopen(url).read()
                    scrape_s.append(time.perf_counter() - started)

            scraper = threading.Thread(target=scrape, daemon=True)
            scraper.start()
            scraped: list[float] = []
            while not scraped or len(scrape_s) < 3:  # a step takes < 1 µs: measure until scrapes happened
                scraped.append(per_step(stepping))
            # the mean over the whole scraped stretch, so the windows a scrape fell in count
            results.setdefault("session.step(), on, scraped at 10 Hz", []).append(sum(scraped) / len(scraped))
            stop.set()
            scraper.join()
            gm.telemetry.shutdown()
    assert scrape_s, "the scraper never ran"
    best = {name: min(times) for name, times in results.items()}
    best["one scrape of /metrics (median wall)"] = sorted(scrape_s)[len(scrape_s) // 2]
    return best


def main() -> None:
    results = measure()
    bare = results["empty loop"]
    for name, seconds in results.items():
        if name.startswith("one scrape"):
            print(f"{name:40s} {seconds * 1e3:8.3f} ms")
        else:
            extra = "" if name == "empty loop" else f"  (overhead {(seconds - bare) * 1e6:.3f} µs)"
            print(f"{name:40s} {seconds * 1e6:8.3f} µs/step{extra}")


if __name__ == "__main__":
    main()
