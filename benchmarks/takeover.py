"""Failover on a fake clock: how soon a dead node's work is taken over, by the store's stamps.

    python -m benchmarks.takeover            # 2 stages × 4 scenarios × 4 stores × 3 seeds of 4 kill instants (~1 minute)
    python -m benchmarks.takeover --quick    # one seed of two instants: a smoke run

Nodes of one run on the fake clock of ``tests/node_sim.py`` (the library's own wiring, every
background pass in due order, no threads, TTL 10 s, poll 0.2 s), each node's loops started at
a random phase (seeded), killed at kill instants spread over a renewal interval, either in the
run's first seconds (``cold``: a node's estimate of the store's clock may not be pinned yet)
or a minute later (``warm``). Each takeover is timed from the dead node's last lease write,
which is where its TTL starts:

* ``syncer``: the elected node of a one-syncer run dies; another holds the syncer lease.
* ``learner``: a learner dies; the elected node drops it from the live set.
* ``spread-node``: a node of a spread run (8 nodes, 8 fragments) dies; its fragment has a live
  closer again (the coordinator, until the new owner has read the assignment).
* ``spread-coordinator``: the coordinator of a spread run dies; a new one is elected and every
  fragment has a live closer again.

Stores: exact stamps (memory), 10 ms (a directory), 1 s (S3's ``Last-Modified``) and the
reference, a store whose reads carry no stamp, where leases are judged on sightings alone (the
rule before stamps: a TTL from the first read that showed the last token, read at the idle pace).

Target (issue 26): a killed node's work taken over within TTL + one poll of its last renewal,
judged on each seed's slowest takeover (the verdict is the median of three seeds' worst).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from benchmarks.targets import MIN_RUNS, Verdict, at_most, information, verdict
from tests.node_sim import IDLE_S, POLL_S, TTL_S, Node, Sim

STORES: dict[str, float | None] = {"exact": 0.0, "directory": 0.01, "s3": 1.0, "no stamps": None}
"""Store → the resolution of its stamps (None: its reads carry none)."""
TARGET_S = TTL_S + POLL_S
SLACK_S = 0.01
"""The fake clock's own granularity: a pass woken by another runs 1 ms later, a few hops a takeover."""
INSTANTS = 4
"""Kill instants per seed, spread over one renewal interval (TTL/3)."""
STAGES = {"cold": 0.0, "warm": 60.0}
"""When the node dies: in the run's first seconds (as soon as the scenario has settled: the nodes'
clocks may not be pinned yet), or after a minute more of it (a running node)."""
ROOT = Path(__file__).resolve().parent.parent


def closers_of(sim: Sim, fragment: int) -> int:
    return sum(fragment in node.syncer.assigned() for node in sim.nodes if node.alive)


def settled(sim: Sim) -> bool:
    """Every fragment has exactly one live node closing it."""
    return all(closers_of(sim, f) == 1 for f in range(len(sim.spec.fragments)))


def covered(sim: Sim) -> bool:
    """Every fragment has a live node closing it (two, briefly, while one hands it over)."""
    return all(closers_of(sim, f) >= 1 for f in range(len(sim.spec.fragments)))


def after_renewal(sim: Sim, node: Node, offset: float) -> float:
    """Run until ``node`` writes its learner lease, then ``offset`` seconds more; the time of its
    latest lease write by then (a write timed to pin the store's clock may have followed)."""
    written = node.exchange.lease
    sim.run_until(sim.clock.now + TTL_S, until=lambda: node.exchange.lease is not written)
    sim.run_until(sim.clock.now + offset)
    return node.lease_written_at


def syncer_dies(resolution: float | None, offset: float, seed: int, warm_s: float) -> float:
    sim = Sim(3, stamp_resolution_s=resolution, phase_seed=seed)
    sim.run_until(2 * TTL_S, until=lambda: sim.leader() is not None)
    sim.run_until(sim.clock.now + warm_s + offset)
    dead = sim.leader()
    assert dead is not None
    dead.alive = False
    renewed = dead.syncer.election.renewed_at
    sim.run_until(renewed + 4 * TTL_S, until=lambda: sim.leader() is not None)
    return sim.clock.now - renewed


def learner_dies(resolution: float | None, offset: float, seed: int, warm_s: float) -> float:
    sim = Sim(3, stamp_resolution_s=resolution, phase_seed=seed)
    sim.run_until(2 * TTL_S, until=lambda: sim.leader() is not None)
    sim.run_until(sim.clock.now + warm_s)
    leader = sim.leader()
    assert leader is not None
    victim = next(node for node in sim.nodes if node is not leader)
    renewed = after_renewal(sim, victim, offset)
    victim.lease_alive = False
    sim.run_until(renewed + 4 * TTL_S, until=lambda: victim.name not in leader.syncer.live)
    return sim.clock.now - renewed


def spread_sim(resolution: float | None, seed: int, warm_s: float) -> Sim:
    sim = Sim(8, quorum=1, fragments=8, layout="spread", stamp_resolution_s=resolution, phase_seed=seed)
    sim.run_until(3 * TTL_S, until=lambda: settled(sim))
    sim.run_until(sim.clock.now + warm_s)
    return sim


def spread_node_dies(resolution: float | None, offset: float, seed: int, warm_s: float) -> float:
    sim = spread_sim(resolution, seed, warm_s)
    leader = sim.leader()
    victim = next(node for node in sim.nodes if node is not leader)
    renewed = after_renewal(sim, victim, offset)
    victim.alive = victim.lease_alive = False
    sim.run_until(renewed + 4 * TTL_S, until=lambda: covered(sim))
    return sim.clock.now - renewed


def spread_coordinator_dies(resolution: float | None, offset: float, seed: int, warm_s: float) -> float:
    sim = spread_sim(resolution, seed, warm_s)
    sim.run_until(sim.clock.now + offset)
    dead = sim.leader()
    assert dead is not None
    dead.alive = dead.lease_alive = False
    renewed = dead.syncer.election.renewed_at
    sim.run_until(renewed + 4 * TTL_S, until=lambda: sim.leader() is not None and covered(sim))
    return sim.clock.now - renewed


SCENARIOS: dict[str, Callable[[float | None, float, int, float], float]] = {
    "syncer": syncer_dies,
    "learner": learner_dies,
    "spread-node": spread_node_dies,
    "spread-coordinator": spread_coordinator_dies,
}


def offsets(seed: int, instants: int) -> list[float]:
    """Kill instants of ``seed``: evenly over one renewal interval, each seed shifted."""
    step = IDLE_S / instants
    return [(i + (seed + 0.5) / MIN_RUNS) * step for i in range(instants)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.takeover", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one seed of two instants")
    parser.add_argument("--runs-dir", default=str(ROOT / "runs"))
    args = parser.parse_args(argv)
    seeds, instants = (1, 2) if args.quick else (MIN_RUNS, INSTANTS)
    out = Path(args.runs_dir) / f"takeover-{datetime.now():%Y%m%d-%H%M%S}"
    out.mkdir(parents=True)
    print(f"fake clock, TTL {TTL_S:g} s, poll {POLL_S:g} s; {seeds} seeds × {instants} kill instants; results in {out}")
    started = time.perf_counter()
    result: dict[str, object] = {"ttl_s": TTL_S, "poll_s": POLL_S, "target_s": TARGET_S, "runs": {}, "targets": []}
    verdicts: list[Verdict] = []
    for stage, warm_s in STAGES.items():
        for scenario, run in SCENARIOS.items():
            for store, resolution in STORES.items():
                times = [
                    [run(resolution, offset, seed * instants + i, warm_s) for i, offset in enumerate(offsets(seed, instants))]
                    for seed in range(seeds)
                ]
                worst = [max(seed_times) for seed_times in times]
                result["runs"][f"{stage}/{scenario}/{store}"] = times  # type: ignore[index]
                bound = f"TTL + one poll ({TARGET_S:g} s)"
                target = f"{stage}: {scenario}, {store}: slowest takeover after the last renewal ≤ {bound}"
                if resolution is None:
                    v = information(target.replace("≤", "against"), worst, "the reference: a store without stamps")
                else:
                    fastest = min(min(t) for t in times)
                    v = verdict(target, worst, at_most(TARGET_S + SLACK_S), detail=f"fastest {fastest:.2f} s")
                verdicts.append(v)
                print(v.line("{:.2f}"), flush=True)
    result["targets"] = [v.as_json() for v in verdicts]
    result["seconds"] = time.perf_counter() - started
    (out / "result.json").write_text(json.dumps(result, indent=2))
    print(f"{result['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
