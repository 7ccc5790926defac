"""The simulator's parameters, each with its value and why, and the closed forms it is tested against.

Every number the simulator uses is a field of :class:`Model`. Three kinds of value:

* **given** by the paper's setting (1.2 M chips, each interrupted about once a year);
* **assumed** (stated, not fitted: slice size and repair time, step time, model size, store
  latency and bandwidth, the lease timings of the library);
* **calibrated** on the paper's two baseline rows only: ``dp_restart_s`` on data-parallel's 27 %
  and ``stall_s`` on elastic data-parallel's 58 %. The Decoupled DiLoCo rows are predictions, with
  one caveat said plainly in the doc: the repair loss (``slice_chips`` × ``slice_repair_s``) was
  chosen with those rows in view (one number for all of them, not per row).

docs/simulator.md has the same table with the reasoning.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal

from gradientmail.syncer.grace import GraceEstimator

__all__ = [
    "PRICES",
    "PRICES_AS_OF",
    "YEAR_S",
    "Model",
    "RequestRates",
    "daly_goodput",
    "elastic_goodput",
    "fit_dp_restart",
    "fit_stall",
    "request_rates",
]

YEAR_S = 365.25 * 86400.0
MIB = 1024 * 1024

PRICES_AS_OF = "AWS S3 Standard, us-east-1, prices as listed 2026"
PRICES = {
    "put": 0.005 / 1000,  # PUT, COPY, POST, LIST: $0.005 per 1,000 requests
    "get": 0.0004 / 1000,  # GET, SELECT, HEAD and every other request: $0.0004 per 1,000
    "delete": 0.0,  # DELETE and CANCEL (abort multipart) are free
}
"""USD per request of each price class (benchmarks/s3_requests.py prices its counts with it too)."""

System = Literal["data_parallel", "elastic_data_parallel", "decoupled"]


@dataclass(frozen=True)
class Model:
    """Every parameter of the simulation. Defaults reproduce Table 1's setting."""

    # --- the cluster (given) ---
    chips: int = 1_200_000
    """Chips in the whole job (the paper's 1.2 M)."""
    chip_mtbf_s: float = YEAR_S
    """Mean time between interruptions of one chip: once a year (the paper's setting)."""

    # --- failures (assumed) ---
    slice_chips: int = 64
    """Chips taken out by one interruption: the failed chip's slice (a 4×4×4 cube), the unit swapped."""
    slice_repair_s: float = 6 * 3600.0
    """How long a failed slice stays out before it is back (repair or replacement from a spare pool).
    With 64 chips and 6 h, 4.4 % of the chips are out at any time (the elastic systems train without them)."""

    # --- data-parallel (calibrated: dp_restart_s) ---
    dp_checkpoint_cost_s: float = 1.0
    """Seconds the job pauses to write an (in-memory, asynchronous-to-storage) checkpoint."""
    dp_checkpoint_interval_s: float | None = None
    """Productive seconds between checkpoints; None: Young/Daly's optimum √(2·cost/λ) (7.3 s here)."""
    dp_restart_s: float = 26.8
    """Seconds from a failure until the whole job trains again (detect, swap in a spare slice, reload
    the checkpoint, recompile). A failure during a restart restarts it. Calibrated on the 27 % row."""

    # --- elastic units: elastic data-parallel, and each Decoupled DiLoCo learner (calibrated: stall_s) ---
    stall_s: float = 17.06
    """Seconds a unit stops when one of its chips fails: detect, drop the slice, reshard, lose the step in
    flight. A failure arriving during a stall joins it (the stall does not restart). Calibrated on the
    58 % row; the same value stops a learner, so one learner is elastic data-parallel by construction."""

    # --- the protocol (GradientMail's defaults where it has them) ---
    step_s: float = 1.0
    """Seconds per inner step (assumed)."""
    sync_every: int = 100
    """H, inner steps between a fragment's exchanges (DiLoCo's default)."""
    fragments: int = 1
    """P, fragments of the model exchanged on a staircase (DiLoCo's default)."""
    quorum_size: int = 1
    """K, contributions a round needs (DiLoCo's default)."""
    overlap_steps: int | None = 100
    """Steps a learner trains past a publish before it waits for that commit (DiLoCo's ``overlap_steps``;
    the library's default is unbounded, here one period so that staleness is bounded)."""
    grace_gamma: float = 0.5
    grace_tau: float = 4.0
    grace_max_s: float = 60.0
    restart_from_committed: bool = False
    """False: a learner is an elastic unit (its surviving slices keep the state; the table's model).
    True: a failure restarts the learner from the committed fragments: it reloads the model and loses the
    training since each fragment's last publish (about H/2 steps)."""

    # --- the syncer and its lease (the library's defaults) ---
    lease_ttl_s: float = 10.0
    """The run's lease TTL (store.spec.DEFAULT_LEASE_TTL_S)."""
    poll_s: float = 0.2
    """Session poll interval while a commit is awaited."""
    stamp_resolution_s: float = 1.0
    """How coarse the store's stamps of writes are (S3's ``Last-Modified``: 1 s): a lease is judged
    dead up to this long after its TTL (INV-6)."""
    syncer_host_chips: int = 8
    """The syncer runs on one learner host: it fails with that host's chips (8 here)."""

    # --- the object store (assumed) ---
    model_bytes: float = 24e9
    """Bytes of one full model copy: the paper's 12 B parameters in bf16."""
    store_latency_s: float = 0.03
    """Seconds of first-byte latency per request chain (S3 in-region, large objects)."""
    learner_bandwidth_bps: float = 1.25e9
    """Bytes/s one learner moves to or from the store (10 Gbit/s)."""
    syncer_bandwidth_bps: float = 12.5e9
    """Bytes/s the syncer moves (100 Gbit/s)."""
    merge_bytes_per_s: float = 20e9
    """Bytes/s of contribution the syncer merges (a host's memory bandwidth, a few passes)."""
    syncer_write_bps: float | None = None
    """Bytes/s of fragment the syncer steps, encodes and writes with its commit (the new parameters
    and the outer optimizer's state); None: ``syncer_bandwidth_bps``. Calibrated per store by
    benchmarks/sim_calibration.py."""
    syncer_round_overhead_s: float | None = None
    """Seconds a round costs whatever its bytes (the listing, the records, the commit's create-once
    write, the retention pass); None: three request latencies."""
    collect_core_s_per_gb: float | None = None
    """Core-seconds the closing node spends per GB of contributions it collects (receiving them,
    sha256, decode, the finite-and-norm pass, the streamed merge's fold), as measured; its collect
    then takes the longer of the link's time and this CPU spread over ``syncer_cores``. None: the
    collect runs at the link's rate alone. benchmarks/sim_calibration.py fits it on real rounds
    of up to 1 GB (docs/simulator.md, "Calibrated on a real store")."""
    syncer_contribution_s: float = 0.0
    """Seconds each contribution adds to a collect whatever its bytes (its record's read, the
    first byte of each of its requests): what makes a round of many small contributions slower
    than its bytes say. Calibrated per store (benchmarks/sim_calibration.py)."""
    syncer_cores: float = 32.0
    """Cores the closing node's collect can use (with ``collect_core_s_per_gb``): a GPU host's
    cores that the data loader leaves, or all of a syncer-only node's."""
    syncer_state_copies: float = 1.0
    """Copies of the fragment the syncer writes beside the new parameters each commit: the outer
    optimizer's state (Nesterov: its momentum, one copy)."""

    # --- the syncer's layout and the network between regions (issue 26) ---
    syncer_layout: Literal["one", "spread"] = "one"
    """``one``: one elected node closes every fragment; ``spread``: the fragments are dealt over the
    live nodes (``DiLoCo.syncer_layout``, INV-23), each closed by one of min(M, P) nodes."""
    closer_bandwidth_bps: float | None = None
    """Bytes/s a node that closes fragments under ``spread`` moves: a learner host's NIC; None:
    ``learner_bandwidth_bps``."""
    egress_usd_per_gb: float = 0.0
    """USD per GB read out of the store's region: 0 in region, 0.02 between AWS regions, 0.09 to
    the internet (AWS list prices, 2026). Counted on every byte a node reads (contributions, commits)."""

    # --- S3 requests (measured on GradientMail, docs/benchmarks-log.md) ---
    idle_requests_per_node_s: float = 2.1
    """Idle reads per node per second (measured 1.7–2.6: LIST/HEAD/GET at TTL/3 cadence)."""
    idle_list_share: float = 0.35
    """Share of the idle requests that are LIST (PUT price class)."""
    part_bytes: float = 8 * MIB
    """Multipart part size: a blob of more adds one UploadPart / ranged GET per part."""

    def __post_init__(self) -> None:
        positive = ("chips", "chip_mtbf_s", "step_s", "sync_every", "fragments", "quorum_size", "model_bytes")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("learner_bandwidth_bps", "syncer_bandwidth_bps", "merge_bytes_per_s", "part_bytes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        for name in ("syncer_write_bps", "closer_bandwidth_bps", "collect_core_s_per_gb"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}")
        if self.syncer_round_overhead_s is not None and self.syncer_round_overhead_s < 0:
            raise ValueError(f"syncer_round_overhead_s must not be negative, got {self.syncer_round_overhead_s!r}")
        if not self.syncer_cores > 0:
            raise ValueError(f"syncer_cores must be positive, got {self.syncer_cores!r}")
        if self.syncer_layout not in ("one", "spread"):
            raise ValueError(f"syncer_layout must be 'one' or 'spread', got {self.syncer_layout!r}")
        for name in (
            "slice_chips",
            "slice_repair_s",
            "stall_s",
            "dp_restart_s",
            "dp_checkpoint_cost_s",
            "store_latency_s",
            "syncer_state_copies",
            "egress_usd_per_gb",
            "syncer_contribution_s",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must not be negative, got {getattr(self, name)!r}")

    # ------------------------------------------------------------------ derived
    @property
    def failure_rate(self) -> float:
        """λ, interruptions per second over the whole cluster."""
        return self.chips / self.chip_mtbf_s

    @property
    def capacity(self) -> float:
        """Expected share of chips not in a slice out for repair (elastic systems)."""
        return max(0.0, 1.0 - self.slice_chips * self.slice_repair_s / self.chip_mtbf_s)

    @property
    def checkpoint_interval_s(self) -> float:
        if self.dp_checkpoint_interval_s is not None:
            return self.dp_checkpoint_interval_s
        return math.sqrt(2 * self.dp_checkpoint_cost_s / self.failure_rate)

    @property
    def fragment_bytes(self) -> float:
        return self.model_bytes / self.fragments

    @property
    def failover_s(self) -> float:
        """A dead syncer is replaced within TTL + the store's stamp resolution + a poll (INV-6),
        then loads the fragments."""
        load = self.store_latency_s + self.model_bytes / self.closing_bandwidth_bps
        return self.lease_ttl_s + self.stamp_resolution_s + self.poll_s + load

    @property
    def round_period_s(self) -> float:
        """Seconds between a learner's publishes (one fragment every H/P steps)."""
        return self.sync_every * self.step_s / self.fragments

    @property
    def closing_bandwidth_bps(self) -> float:
        """Bytes/s of the node that closes a fragment: the one syncer's, or a learner host's under ``spread``."""
        if self.syncer_layout == "one":
            return self.syncer_bandwidth_bps
        return self.closer_bandwidth_bps if self.closer_bandwidth_bps is not None else self.learner_bandwidth_bps

    def collect_s(self, contributions: float) -> float:
        """Seconds the closing node takes to collect ``contributions`` (fetch, check, fold): their
        bytes at the link's rate or, with ``collect_core_s_per_gb``, at the rate its cores sustain,
        whichever is slower (the two overlap: parts are hashed as they arrive), plus
        ``syncer_contribution_s`` for each."""
        nbytes = contributions * self.fragment_bytes
        fixed = contributions * self.syncer_contribution_s
        link = nbytes / self.closing_bandwidth_bps
        if self.collect_core_s_per_gb is None:
            return fixed + link
        return fixed + max(link, nbytes / 1e9 * self.collect_core_s_per_gb / self.syncer_cores)

    def sync_s(self, contributions: float) -> float:
        """ξ_sync: the closing node fetches the contributions, merges, steps, writes and commits the
        fragment: a fixed cost, the contributions' collect (``collect_s``) and their bytes at the
        merge rate, the fragment at the write rate."""
        size = self.fragment_bytes
        overhead = 3 * self.store_latency_s if self.syncer_round_overhead_s is None else self.syncer_round_overhead_s
        fetch = self.collect_s(contributions)
        merge = contributions * size / self.merge_bytes_per_s
        write_bps = self.closing_bandwidth_bps if self.syncer_write_bps is None else self.syncer_write_bps
        return overhead + fetch + merge + size / write_bps

    def grace_s(self, contributions: int) -> float:
        """The grace window the library's estimator opens for a round (quorum reached as the learners
        publish together: ξ_quorum ≈ 0)."""
        estimator = GraceEstimator(gamma=self.grace_gamma, tau=self.grace_tau, max_s=self.grace_max_s)
        estimator.observe_step_times([self.step_s])
        estimator.observe_sync(self.sync_s(contributions))
        return estimator.window(0.0)

    def commit_latency_s(self, contributions: int) -> float:
        """From a publish to the learner holding the commit: upload, grace, ξ_sync, poll, download."""
        size = self.fragment_bytes
        upload = self.store_latency_s + size / self.learner_bandwidth_bps
        download = self.store_latency_s + size / self.learner_bandwidth_bps
        return upload + self.grace_s(contributions) + self.sync_s(contributions) + self.poll_s + download

    @property
    def overlap_s(self) -> float:
        return math.inf if self.overlap_steps is None else self.overlap_steps * self.step_s

    def sync_efficiency(self, contributions: int) -> float:
        """Share of a running learner's time not spent waiting for commits in steady state: it waits
        max(0, latency − overlap) per publish, and no less than the busiest closing node's backlog
        when it closes more than it can in a period (``syncer_load`` > 1 caps the rate at 1/load)."""
        wait = max(0.0, self.commit_latency_s(contributions) - self.overlap_s)
        return min(self.round_period_s / (self.round_period_s + wait), 1.0 / max(1.0, self.syncer_load(contributions)))

    # ------------------------------------------------------------------ the closing nodes (issue 26)
    def closers(self, learners: int) -> int:
        """Nodes that close fragments: the one syncer, or min(M, P) under ``spread`` (INV-23 deals
        each fragment to one live node, the largest to the least loaded)."""
        return 1 if self.syncer_layout == "one" else max(1, min(learners, self.fragments))

    def fragments_on_busiest(self, learners: int) -> int:
        """Fragments the busiest closing node closes: all P, or ⌈P / min(M, P)⌉ under ``spread``."""
        return math.ceil(self.fragments / self.closers(learners))

    def syncer_load(self, learners: float, contributions: float | None = None) -> float:
        """Seconds the busiest closing node spends closing rounds per sync period (H steps, in which
        every fragment is exchanged once) over that period: above 1 it falls behind and the learners
        wait for it. Each of its fragments closes ``learners / contributions`` rounds per period
        (one when every round carries all M)."""
        carried = learners if contributions is None else contributions
        rounds = self.fragments_on_busiest(math.ceil(learners)) * learners / max(carried, 1e-12)
        return rounds * self.sync_s(carried) / (self.sync_every * self.step_s)

    def restart_reload_s(self) -> float:
        return self.store_latency_s + self.model_bytes / self.learner_bandwidth_bps

    def with_(self, **changes: Any) -> Model:
        return replace(self, **changes)


# ---------------------------------------------------------------------- closed forms
def daly_goodput(rate: float, work_s: float, checkpoint_s: float, restart_s: float) -> float:
    """Data-parallel goodput with exponential failures (Daly 2006): a segment of ``work_s`` productive
    seconds plus a ``checkpoint_s`` write takes e^{λR}(e^{λ(W+δ)} − 1)/λ on average."""
    expected = math.exp(rate * restart_s) * math.expm1(rate * (work_s + checkpoint_s)) / rate
    return work_s / expected


def elastic_goodput(rate: float, stall_s: float, capacity: float, units: int = 1) -> float:
    """An elastic unit hit at rate λ/units, each hit a stall of S that later hits join: an alternating
    renewal process, available 1/(1 + λS/units) of the time, at ``capacity``."""
    return capacity / (1.0 + rate * stall_s / units)


def _bisect(func: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of a decreasing ``func`` between ``lo`` and ``hi``."""
    for _ in range(100):
        mid = (lo + hi) / 2
        if func(mid) > 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def fit_dp_restart(model: Model, target: float) -> float:
    """The restart time that gives data-parallel ``target`` goodput (the calibration of ``dp_restart_s``)."""
    rate, work, cost = model.failure_rate, model.checkpoint_interval_s, model.dp_checkpoint_cost_s
    return _bisect(lambda r: daly_goodput(rate, work, cost, r) - target, 0.0, 1e4)


def fit_stall(model: Model, target: float) -> float:
    """The stall that gives elastic data-parallel ``target`` goodput (the calibration of ``stall_s``)."""
    return (model.capacity / target - 1.0) / model.failure_rate


# ---------------------------------------------------------------------- S3 requests
@dataclass(frozen=True)
class RequestRates:
    put_per_s: float
    """PUT/COPY/POST/LIST class requests per second."""
    get_per_s: float
    """GET/HEAD class requests per second."""

    @property
    def per_s(self) -> float:
        return self.put_per_s + self.get_per_s

    @property
    def usd_per_day(self) -> float:
        return 86400.0 * (self.put_per_s * PRICES["put"] + self.get_per_s * PRICES["get"])


def round_requests(model: Model, contributions: float) -> tuple[float, float]:
    """(put-class, get-class) requests of one fragment round with ``contributions`` learners.

    Measured on GradientMail (11 + 9·M): the syncer's closing pass 2M+1 GET, 1 HEAD, 5 LIST, 4 PUT;
    each learner's publish 1 HEAD + 2 PUT and fetch 2 HEAD + 2 GET. A blob over one part adds, per
    blob, its extra parts plus the multipart create/complete on upload and its extra ranged GETs."""
    m = contributions
    put = 9 + 2 * m
    get = 2 + 7 * m
    parts = max(1, math.ceil(model.fragment_bytes / model.part_bytes))
    if parts > 1:
        put += (m + 1) * (parts + 1)  # m contributions + 1 commit: create + parts + complete − the plain PUT
        get += 2 * m * (parts - 1)  # the syncer reads m contributions, m learners read the commit
    return put, get


def request_rates(model: Model, learners: int, contributions: float, round_fraction: float = 1.0) -> RequestRates:
    """Requests per second of a run of ``learners`` nodes (+ the syncer beside one of them) whose
    rounds carry ``contributions`` learners on average; ``round_fraction`` of the nominal rounds happen
    (rounds stop while learners wait)."""
    put, get = round_requests(model, contributions)
    rounds_per_s = round_fraction * model.fragments / (model.sync_every * model.step_s)
    idle = model.idle_requests_per_node_s * learners
    return RequestRates(
        put_per_s=rounds_per_s * put + idle * model.idle_list_share,
        get_per_s=rounds_per_s * get + idle * (1 - model.idle_list_share),
    )
