"""One learner of benchmarks/peer_torchft.py: ``python -m benchmarks.peer_worker --arm ARM …``.

Every arm trains the same MLP (512 → 1024 → 1024 → 64, 1,640,512 fp32 parameters, the same
seeded initial weights) on the same synthetic task: Gaussian inputs labelled by a fixed random
teacher network, one data stream per learner rank, batches drawn before the loop starts. The
inner optimizer is AdamW; every H steps the exchange under test runs:

* ``bare``: none; the reference loop.
* ``ddp``: data-parallel, the step-by-step reference: ``DistributedDataParallel`` over gloo
  (``--master-port`` on 127.0.0.1), every step's gradients all-reduced across the learners (each
  on its own data stream, so the samples per step are the other arms'), one AdamW per rank.
* ``torchft``: ``torchft.local_sgd.DiLoCo`` around the inner optimizer, a ``torchft.Manager``
  (one replica group of one rank per process, gloo, synchronous quorum) against a lighthouse;
  outer step SGD(lr 0.7, momentum 0.9, nesterov). Needs torchft: runs in its own environment.
* ``gradientmail``: a ``gm.Session`` (``gm.DiLoCo(sync_every=H)``, otherwise its defaults)
  around the loop, on the mailbox URL given; the mailbox is wrapped to count the bytes this
  process (learner and, when elected, syncer) puts and gets.

After set-up each worker writes ``--ready`` and waits for ``--go`` to exist, so the learners'
loops start together. It times the loop (first to last step), the time the exchange holds the
training thread (torchft: its optimizer post-step hook; GradientMail: ``session.step()``), the
loop's CPU seconds (every thread of the process) and evaluates the final model on a held-out
batch; all of it goes to ``--out`` as JSON. Only ``gradientmail`` imports gradientmail, so the
other arms run in an environment without it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import resource
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

INPUTS, HIDDEN, CLASSES = 512, 1024, 64
TEACHER_SEED, MODEL_SEED, HELD_OUT_SEED = 12345, 0, 999
HELD_OUT = 2048
LR = 1e-3
OUTER_LR, OUTER_MOMENTUM = 0.7, 0.9  # gm.DiLoCo's defaults, given to torchft's outer SGD


def build_model(hidden: int = HIDDEN) -> nn.Module:
    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(nn.Linear(INPUTS, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, CLASSES))


def _teacher() -> nn.Module:
    torch.manual_seed(TEACHER_SEED)
    return nn.Sequential(nn.Linear(INPUTS, 256), nn.Tanh(), nn.Linear(256, CLASSES))


@torch.no_grad()
def make_batches(seed: int, count: int, batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``count`` batches of the task, drawn from ``seed``: the same for every arm."""
    teacher = _teacher()
    generator = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        x = torch.randn(batch, INPUTS, generator=generator)
        out.append((x, teacher(x).argmax(dim=1)))
    return out


@torch.no_grad()
def evaluate(model: nn.Module) -> float:
    ((x, y),) = make_batches(HELD_OUT_SEED, 1, HELD_OUT)
    return float(nn.functional.cross_entropy(model(x), y))


def _wait_for_go(ready: Path, go: Path, timeout_s: float = 300.0) -> None:
    ready.write_text(str(os.getpid()))
    deadline = time.monotonic() + timeout_s
    while not go.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"no go signal ({go}) after {timeout_s} s")
        time.sleep(0.005)


class _Clock:
    """Loop timing: wall and CPU seconds of the loop, and time the exchange held the thread."""

    def __init__(self) -> None:
        self.blocked_s = 0.0
        self.blocked: list[float] = []  # per step where the exchange took > 0.5 ms
        self.loop_s = 0.0
        self.loop_cpu_s = 0.0

    def add_blocked(self, seconds: float) -> None:
        self.blocked_s += seconds
        if seconds > 5e-4:
            self.blocked.append(seconds)


def _train(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: list[tuple[torch.Tensor, torch.Tensor]],
    clock: _Clock,
    after_step: Any = None,
) -> list[float]:
    losses = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for x, y in batches:
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step()
    clock.loop_s = time.perf_counter() - wall0
    clock.loop_cpu_s = time.process_time() - cpu0
    return losses


def run_bare(args: argparse.Namespace, batches: list, clock: _Clock) -> dict[str, Any]:
    model = build_model(args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    _wait_for_go(args.ready, args.go)
    losses = _train(model, optimizer, batches, clock)
    return {"losses": losses, "eval_loss": evaluate(model)}


def run_sync(args: argparse.Namespace, batches: list, clock: _Clock) -> dict[str, Any]:
    """Synchronous DiLoCo in one process, the quality reference: ``--learners`` replicas (this
    worker's rank's data stream and the others'), each with its own AdamW, in lock-step; every
    H steps the mean of their pseudo-gradients θ_global − θ_i goes through the outer Nesterov
    SGD (the same lr and momentum as the other arms) and every replica restarts from the result.
    Every worker of the arm runs all replicas (deterministic: they all end with the same model);
    its losses are its own rank's replica's. Its loop time is ``--learners`` replicas' work, so
    the arm is a quality reference, not a throughput one."""
    models = [build_model(args.hidden) for _ in range(args.learners)]
    glob = build_model(args.hidden)
    inners = [torch.optim.AdamW(m.parameters(), lr=LR) for m in models]
    outer = torch.optim.SGD(glob.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    streams = [batches if r == args.rank else make_batches(1 + r, args.steps, args.batch) for r in range(args.learners)]
    _wait_for_go(args.ready, args.go)
    losses: list[float] = []
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for step in range(args.steps):
        for r, (model, inner) in enumerate(zip(models, inners, strict=True)):
            x, y = streams[r][step]
            inner.zero_grad(set_to_none=True)
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            inner.step()
            if r == args.rank:
                losses.append(loss.item())
        if (step + 1) % args.sync_every == 0:
            before = time.perf_counter()
            outer.zero_grad(set_to_none=True)
            with torch.no_grad():
                for g, *locals_ in zip(glob.parameters(), *(m.parameters() for m in models), strict=True):
                    g.grad = sum(g - p for p in locals_) / len(locals_)
            outer.step()
            state = glob.state_dict()
            for model in models:
                model.load_state_dict(state)
            clock.add_blocked(time.perf_counter() - before)
    clock.loop_s = time.perf_counter() - wall0
    clock.loop_cpu_s = time.process_time() - cpu0
    syncs = args.steps // args.sync_every
    return {"losses": losses, "eval_loss": evaluate(glob), "committed_syncs": syncs, "bytes_up": 0, "bytes_down": 0}


def run_ddp(args: argparse.Namespace, batches: list, clock: _Clock) -> dict[str, Any]:
    """Data-parallel: gloo's ring all-reduce of every step's gradients, overlapped with the
    backward pass by DDP's buckets. The exchange's time is not split from the step's (it runs
    inside ``backward``), so the arm has a throughput and a loss, no blocked time."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{args.master_port}",
        rank=args.rank,
        world_size=args.learners,
        timeout=timedelta(seconds=300),
    )
    try:
        model = DistributedDataParallel(build_model(args.hidden))
        optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
        _wait_for_go(args.ready, args.go)
        losses = _train(model, optimizer, batches, clock)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    parameters = sum(p.numel() for p in model.parameters())
    ring = args.steps * 2 * (args.learners - 1) / args.learners * 4 * parameters  # every step, each way
    return {"losses": losses, "eval_loss": evaluate(model.module), "bytes_up": ring, "bytes_down": ring}


def run_torchft(args: argparse.Namespace, batches: list, clock: _Clock) -> dict[str, Any]:
    from torch.distributed import TCPStore
    from torchft.local_sgd import DiLoCo
    from torchft.manager import Manager
    from torchft.process_group import ProcessGroupGloo

    model = build_model(args.hidden)
    inner = torch.optim.AdamW(model.parameters(), lr=LR)
    outer = torch.optim.SGD(model.parameters(), lr=OUTER_LR, momentum=OUTER_MOMENTUM, nesterov=True)
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)  # this replica group's own store

    def load_state_dict(state: dict[str, Any]) -> None:
        model.load_state_dict(state["model"])
        inner.load_state_dict(state["inner"])

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "inner": inner.state_dict()}

    timeout = timedelta(seconds=120)
    manager = Manager(
        pg=ProcessGroupGloo(timeout=timeout),
        load_state_dict=load_state_dict,
        state_dict=state_dict,
        min_replica_size=args.learners,
        use_async_quorum=False,  # DiLoCo requires it
        timeout=timeout,
        quorum_timeout=timeout,
        connect_timeout=timeout,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"replica_{args.rank}",
        hostname="127.0.0.1",
        init_sync=False,  # every replica starts from the same seeded weights
    )
    started: list[float] = []
    # DiLoCo syncs in a post-step hook of the inner optimizer; hooks run in the order they were
    # registered, so one hook before DiLoCo's and one after bracket its work.
    inner.register_step_post_hook(lambda *_: started.append(time.perf_counter()))
    try:
        with DiLoCo(manager, [model], inner, outer, sync_every=args.sync_every):
            inner.register_step_post_hook(lambda *_: clock.add_blocked(time.perf_counter() - started.pop()))
            _wait_for_go(args.ready, args.go)
            losses = _train(model, inner, batches, clock)
        committed = manager.current_step()
    finally:
        manager.shutdown(wait=False)
    parameters = sum(p.numel() for p in model.parameters())
    return {
        "losses": losses,
        "eval_loss": evaluate(model),
        "committed_syncs": committed,
        "torchft_version": importlib.metadata.version("torchft"),
        # gloo's allreduce of S bytes among n ranks sends and receives 2(n−1)/n × S per rank
        "bytes_up": committed * 2 * (args.learners - 1) / args.learners * 4 * parameters,
        "bytes_down": committed * 2 * (args.learners - 1) / args.learners * 4 * parameters,
    }


class CountingMailbox:
    """A mailbox that counts the payload bytes it puts (up) and gets (down) for its process."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self._lock = threading.Lock()
        self.up = 0
        self.down = 0
        self.requests = 0

    def _count(self, up: int = 0, down: int = 0) -> None:
        with self._lock:
            self.up += up
            self.down += down
            self.requests += 1

    @property
    def url(self) -> str:
        return self._inner.url

    def get(self, key: str, *, max_bytes: int | None = None) -> bytes:
        data = self._inner.get(key, max_bytes=max_bytes)
        self._count(down=len(data))
        return data

    def get_versioned(self, key: str, *, max_bytes: int | None = None) -> tuple[bytes, str]:
        data, token = self._inner.get_versioned(key, max_bytes=max_bytes)
        self._count(down=len(data))
        return data, token

    def head(self, key: str) -> Any:
        self._count()
        return self._inner.head(key)

    def exists(self, key: str) -> bool:
        self._count()
        return self._inner.exists(key)

    def put(self, key: str, data: bytes) -> str:
        token = self._inner.put(key, data)
        self._count(up=len(data))
        return token

    def create(self, key: str, data: bytes) -> str:
        try:
            return self._inner.create(key, data)
        finally:
            self._count(up=len(data))

    def swap(self, key: str, data: bytes, expected_token: str) -> str:
        try:
            return self._inner.swap(key, data, expected_token)
        finally:
            self._count(up=len(data))

    def list(self, prefix: str = "") -> list[str]:
        self._count()
        return self._inner.list(prefix)

    def delete(self, key: str) -> None:
        self._count()
        self._inner.delete(key)

    def close(self) -> None:
        self._inner.close()


def run_gradientmail(args: argparse.Namespace, batches: list, clock: _Clock) -> dict[str, Any]:
    import gradientmail as gm
    from gradientmail.regime import link_hint
    from gradientmail.session.transfer_meter import LinkReading

    model = build_model(args.hidden)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    mailbox = CountingMailbox(gm.open_mailbox(args.mailbox))
    options = gm.SessionOptions(poll_interval_s=args.poll, lease_ttl_s=max(10.0, 20 * args.poll))  # 10 s: the default TTL
    samples = len(batches[0][1])
    merge = gm.WeightedMean() if args.merge == "weighted_mean" else gm.Rda()
    knobs: dict[str, Any] = {}
    if args.overlap_steps is not None:
        knobs["overlap_steps"] = args.overlap_steps
    if args.no_carry:
        knobs["carry_unmerged"] = False
    if args.max_staleness:
        knobs["max_staleness"] = args.max_staleness
    if args.grace_max_s is not None:
        knobs["grace_max_s"] = args.grace_max_s
    if args.grace_tau is not None:
        knobs["grace_tau"] = args.grace_tau
    knobs.update(json.loads(args.knobs) if args.knobs else {})
    algorithm = gm.DiLoCo(sync_every=args.sync_every, quorum_size=args.quorum, merge=merge, **knobs)
    opened = time.perf_counter()
    with gm.Session(model, algorithm=algorithm, mailbox=mailbox, learner_id=f"learner-{args.rank}", options=options) as session:
        open_s = time.perf_counter() - opened
        _wait_for_go(args.ready, args.go)

        aligned: list[tuple[int, int]] = []  # (step, version) whenever the learner aligned with a newer commit
        # (step, wall clock, event, value): "publish" (its base version) and "align" (the version)
        timeline: list[tuple[int, float, str, int]] = []
        count = 0

        def step() -> None:
            nonlocal count
            published = session.stats.contributions
            base = session.versions[0]
            before = time.perf_counter()
            session.step(samples=samples)
            clock.add_blocked(time.perf_counter() - before)
            count += 1
            if session.stats.contributions > published:
                timeline.append((count, time.time(), "publish", base))
            version = session.versions[0]
            if version > (aligned[-1][1] if aligned else 0):
                aligned.append((count, version))
                timeline.append((count, time.time(), "align", version))

        losses = _train(model, optimizer, batches, clock, after_step=step)
        link: LinkReading | None = session.link_reading  # what a sync period's transfers needed, as the lease said
        spec = session.spec
        hint = link_hint(session.learner_id, link, spec) if link is not None and spec is not None else None
        closing = time.perf_counter()
    close_s = time.perf_counter() - closing
    mailbox.close()
    return {
        "losses": losses,
        "eval_loss": evaluate(model),  # closing set the model to the newest committed parameters
        "bytes_up": mailbox.up,
        "bytes_down": mailbox.down,
        "mailbox_requests": mailbox.requests,
        "bytes_published": session.bytes_published,
        "bytes_fetched": session.bytes_fetched,
        "contributions": session.stats.contributions,
        "versions": dict(session.versions),
        "open_s": open_s,
        "close_s": close_s,
        "aligned": aligned,
        "timeline": timeline,
        # steps from the publish of version v's round (step v × H) to aligning with it
        "align_lag_steps": [at - version * args.sync_every for at, version in aligned],
        "link": link.as_info() if link is not None else None,
        "link_hint": hint,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peer_worker")
    parser.add_argument("--arm", choices=["bare", "sync", "ddp", "torchft", "gradientmail"], required=True)
    parser.add_argument("--rank", type=int, default=0, help="this learner's index: picks its data stream")
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--sync-every", type=int, default=20)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=HIDDEN, help="MLP width (smaller for a quick run)")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--mailbox", default=None, help="gradientmail: the mailbox URL")
    parser.add_argument("--poll", type=float, default=0.2, help="gradientmail: poll interval (s; its default: 0.2)")
    parser.add_argument("--quorum", type=int, default=1, help="gradientmail: quorum_size (its default: 1)")
    parser.add_argument("--merge", choices=["rda", "weighted_mean"], default="rda", help="gradientmail: the merge (default: rda)")
    parser.add_argument("--overlap-steps", type=int, default=None, help="gradientmail: overlap_steps (default: None)")
    parser.add_argument("--no-carry", action="store_true", help="gradientmail: carry_unmerged=False")
    parser.add_argument("--max-staleness", type=int, default=0, help="gradientmail: max_staleness (default 0)")
    parser.add_argument("--grace-max-s", type=float, default=None, help="gradientmail: grace_max_s")
    parser.add_argument("--grace-tau", type=float, default=None, help="gradientmail: grace_tau")
    parser.add_argument("--knobs", default=None, help="gradientmail: more gm.DiLoCo fields, as JSON")
    parser.add_argument("--lighthouse", default=None, help="torchft: the lighthouse address, http://HOST:PORT")
    parser.add_argument("--master-port", type=int, default=None, help="ddp: the rendezvous port on 127.0.0.1 (rank 0's)")
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    batches = make_batches(1 + args.rank, args.steps, args.batch)
    clock = _Clock()
    runners = {"bare": run_bare, "sync": run_sync, "ddp": run_ddp, "torchft": run_torchft, "gradientmail": run_gradientmail}
    runner = runners[args.arm]
    result = runner(args, batches, clock)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    result.update(
        arm=args.arm,
        rank=args.rank,
        steps=args.steps,
        syncs=args.steps // args.sync_every,
        parameters=sum(p.numel() for p in build_model(args.hidden).parameters()),
        loop_s=clock.loop_s,
        loop_cpu_s=clock.loop_cpu_s,
        process_cpu_s=usage.ru_utime + usage.ru_stime,
        blocked_s=clock.blocked_s,
        blocked_steps_ms=[round(s * 1e3, 3) for s in clock.blocked],
        torch_version=torch.__version__,
        final_train_loss=sum(result["losses"][-10:]) / len(result["losses"][-10:]),
    )
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
