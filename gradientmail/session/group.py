"""A learner that is a data-parallel group: ``torchrun`` ranks training one model replica with
DDP, or one model sharded over them with FSDP2.

DiLoCo's learner is an island of devices. Under ``torchrun`` (``torch.distributed`` initialised,
world size > 1) every rank constructs the same ``gm.Session`` around the same model (the module
inside ``DistributedDataParallel``, the DDP wrapper itself, or a module ``fully_shard`` made);
the group is **one** learner of the run:

* rank 0 (the leader) is the protocol's learner: it joins the run, holds the learner lease,
  publishes one contribution per fragment per round, runs the syncer when elected, and aligns
  with commits. Under DDP its parameters are every rank's (DDP keeps the replicas equal); under
  FSDP it works on a full copy of the model in host memory (``full_mirror``), which it fills
  from the shards of a fragment just before reading it (a publish; a carry or blend when
  aligning) and sends back after changing it;
* the other ranks (followers) never touch the mailbox. Each ``step()`` is a collective led by
  rank 0: its commands, one integer each, say "gather these parameters" (FSDP: every rank's
  all-gather of the fragment into rank 0's copy), "take these parameters" (a broadcast, or
  under FSDP each rank's shard scattered from rank 0) or "done". A step with no exchange is one
  broadcast of one integer; the ranks leave every step identical. ``open()`` and ``close()``
  transfer the whole model the same way;
* samples: each rank passes its own batch to ``step(samples=...)``; the leader reports
  ``samples × world size`` (the ranks train equal batches), so the group weighs as one
  learner with the global batch.

Cost per step: one broadcast of one integer from rank 0; per alignment (one fragment's commit,
about every ``H / fragments`` steps) one transfer of that fragment's parameters; under FSDP also
one all-gather of a fragment per publish. Every rank must call ``step()`` the same number of
times and leave the ``with`` block together, as for any collective. Rank 0 of an FSDP group
needs host memory for the full model (the session already keeps its committed anchor there).
"""

from __future__ import annotations

import logging
import os
from collections import deque
from typing import Any

from gradientmail.errors import InvalidConfig

__all__ = ["GroupLink", "detect_group", "finish_launched_group", "init_launched_group", "launched_rank", "unwrap_model"]

log = logging.getLogger(__name__)


def _distributed() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def launched_rank() -> int | None:
    """This process's rank when a launcher (``torchrun``) started several (``WORLD_SIZE`` > 1),
    else None: only rank 0 serves the node's metrics endpoint."""
    try:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        return int(os.environ["RANK"]) if world > 1 else None
    except (KeyError, ValueError):
        return None


def init_launched_group() -> bool:
    """Under ``torchrun`` (``gradientmail node`` in a pod of several GPUs), initialise
    torch.distributed for the training script: NCCL on the rank's GPU (``LOCAL_RANK``) when
    CUDA is there, else gloo. False (nothing done) outside a launcher or when already done."""
    if launched_rank() is None:
        return False
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    log.info("rank %d of %d of this learner", dist.get_rank(), dist.get_world_size())
    return True


def finish_launched_group() -> None:
    """End the process group ``init_launched_group`` started, every rank together: a barrier,
    then its destruction (a rank that exits while another still talks to it aborts the job)."""
    dist = _distributed()
    if dist is not None:
        dist.barrier()
        dist.destroy_process_group()


def unwrap_model(model: Any) -> Any:
    """The module inside a ``DistributedDataParallel`` wrapper (names without ``module.``)."""
    try:
        from torch.nn.parallel import DistributedDataParallel
    except ImportError:
        return model
    return model.module if isinstance(model, DistributedDataParallel) else model


_RECENT_WORKS = 16
_RECENT: deque[Any] = deque(maxlen=_RECENT_WORKS)
"""The newest collective works of this process's links, held for the life of the process
(``GroupLink._broadcast``): a barrier the user calls after the session keeps strong references
to the works still in flight when it was queued, and gloo's worker thread drops them when it
retires the barrier, possibly as the process exits; holding them here, that drop is never the
last, so it never needs the GIL the exiting main thread holds while joining that thread."""
_DONE, _GATHER, _SCATTER = 0, 1, 2
"""The leader's commands to its followers within one ``step()`` (module docstring)."""


def _is_sharded(tensor: Any) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(tensor, DTensor)


def full_mirror(model: Any) -> Any:
    """A module of plain CPU tensors of the full shapes of ``model``'s parameters, under the
    same names: what the leader of an FSDP group reads and writes in place of its shards."""
    import torch

    root = torch.nn.Module()
    for name, param in model.named_parameters():
        *path, leaf = name.split(".")
        owner = root
        for part in path:
            child = owner._modules.get(part)
            if child is None:
                child = torch.nn.Module()
                owner.add_module(part, child)
            owner = child
        owner.register_parameter(leaf, torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype), requires_grad=False))
    return root


class GroupLink:
    """This rank's link to the other ranks of its learner (module docstring).

    ``model`` is the rank's module. When its parameters are sharded (FSDP2: ``DTensor``) the
    leader works on :attr:`view`, a full copy in host memory, refreshed by :meth:`gather`
    before the session reads a fragment and sent back by :meth:`scatter`; otherwise the view
    is the model itself and gathering costs nothing.
    """

    def __init__(self, dist: Any, group: Any, model: Any) -> None:
        self._dist = dist
        self._group = group
        self.rank = int(dist.get_rank(group))
        self.world_size = int(dist.get_world_size(group))
        self._model = model
        self._params = dict(model.named_parameters())
        self.sharded = any(_is_sharded(p) for p in self._params.values())
        """FSDP: the ranks hold shards, the leader a full view."""
        self.view = full_mirror(model) if self.sharded and self.is_leader else model
        """What the leader's session reads and writes: the model, or its full mirror under FSDP."""
        self._view = dict(self.view.named_parameters())

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    @property
    def names(self) -> list[str]:
        """Every parameter's name, in the order the ranks transfer them."""
        return sorted(self._params)

    # -- the leader's side -------------------------------------------------------------
    def gather(self, names: list[str], *, command: bool = True) -> None:
        """Bring ``names`` into the leader's view from the shards (FSDP; nothing otherwise). In
        a step the leader sends the command first, so the followers join the collective."""
        if not self.sharded:
            return
        if command:
            self._command(_GATHER, names)
        self._gather(names)

    def scatter(self, names: list[str], *, command: bool = True) -> None:
        """Send ``names`` from the leader's view to every rank (a broadcast, or each rank's
        shard under FSDP)."""
        if command:
            self._command(_SCATTER, names)
        self._scatter(names)

    def end_step(self, changed: list[str]) -> None:
        """The end of the leader's step: the parameters it changed go to every rank, then the
        followers are released (one broadcast of one integer when nothing changed)."""
        if changed:
            self.scatter(changed)
        self._send(_DONE)

    # -- a follower's side -------------------------------------------------------------
    def follow_step(self) -> None:
        """Take part in the leader's step: join its gathers and scatters until it is done."""
        while True:
            code = self._receive()
            if code == _DONE:
                return
            names = self.share_object(None)
            if code == _GATHER:
                self._gather(names)
            else:
                self._scatter(names)

    # -- both ----------------------------------------------------------------------------
    def share_object(self, value: Any) -> Any:
        """The leader's ``value`` on every rank (a small picklable object; a collective: its
        length, then its pickle, both through ``_broadcast``)."""
        import pickle

        import torch

        data = pickle.dumps(value) if self.is_leader else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        self._broadcast(size)
        buffer = (
            torch.frombuffer(bytearray(data), dtype=torch.uint8)
            if self.is_leader
            else torch.empty(int(size.item()), dtype=torch.uint8)
        )
        self._broadcast(buffer)
        return value if self.is_leader else pickle.loads(buffer.numpy().tobytes())

    def _command(self, code: int, names: list[str]) -> None:
        self._send(code)
        self.share_object(names)

    def _send(self, code: int) -> None:
        import torch

        self._broadcast(torch.tensor([code], dtype=torch.int64))

    def _receive(self) -> int:
        import torch

        box = torch.zeros(1, dtype=torch.int64)
        self._broadcast(box)
        return int(box.item())

    def _broadcast(self, tensor: Any) -> None:
        """A broadcast from the leader whose work is kept in ``_RECENT``: freed by a thread that
        holds the GIL, never as the last reference in gloo's worker thread, which would need
        the GIL to free its tensors and deadlock a process exiting right after the group's
        last collective (the process group's destructor joins that thread holding the GIL)."""
        work = self._dist.broadcast(tensor, src=self._source(), group=self._group, async_op=True)
        work.wait()
        _RECENT.append(work)

    def _gather(self, names: list[str]) -> None:
        import torch

        with torch.no_grad():
            for name in names:
                param = self._params[name]
                if _is_sharded(param):
                    full = param.full_tensor()  # an all-gather: every rank takes part
                    if self.is_leader:
                        self._view[name].copy_(full)
                elif self.is_leader and self._view[name] is not param:
                    self._view[name].copy_(param.detach())  # not sharded: the leader's own is every rank's

    def _scatter(self, names: list[str]) -> None:
        import torch

        with torch.no_grad():
            for name in names:
                param = self._params[name]
                if _is_sharded(param):
                    from torch.distributed.tensor import distribute_tensor

                    local = param.to_local()
                    if self.is_leader:
                        full = self._view[name].to(device=local.device, dtype=local.dtype)
                    else:
                        full = torch.empty(param.shape, dtype=local.dtype, device=local.device)
                    shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=0)
                    local.copy_(shard.to_local())  # from rank 0: each rank receives its own shard
                else:
                    if self.is_leader and self._view[name] is not param:
                        param.data.copy_(self._view[name].to(param.device))
                    self._broadcast(param.data)

    def _source(self) -> int:
        return 0 if self._group is None else self._dist.get_global_rank(self._group, 0)


def detect_group(group: Any, backend_name: str, model: Any) -> GroupLink | None:
    """The group this learner is: ``"auto"`` takes torch.distributed's default group when it is
    initialised with more than one rank; None: no group; a ``ProcessGroup``: that one."""
    if group is None:
        return None
    dist = _distributed()
    if dist is None:
        if group != "auto":
            raise InvalidConfig("group", "torch.distributed is not initialised: start the learner with torchrun")
        return None
    if backend_name != "torch":
        raise InvalidConfig("group", "a learner of several ranks needs the torch backend")
    process_group = None if group == "auto" else group
    if int(dist.get_world_size(process_group)) == 1:
        return None
    link = GroupLink(dist, process_group, model)
    log.info("rank %d of %d: %s", link.rank, link.world_size, "the group's learner" if link.is_leader else "following rank 0")
    return link
