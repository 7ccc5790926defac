"""A learner that is a data-parallel group: ``torchrun`` ranks training one model replica with DDP.

DiLoCo's learner is an island of devices. Under ``torchrun`` (``torch.distributed`` initialised,
world size > 1) every rank constructs the same ``gm.Session`` around the same model (the module
inside ``DistributedDataParallel``, or the DDP wrapper itself: the session unwraps it); the
group is **one** learner of the run:

* rank 0 (the leader) is the protocol's learner: it joins the run, holds the learner lease,
  publishes one contribution per fragment per round (its parameters are every rank's: DDP keeps
  the replicas equal), runs the syncer when elected, and aligns with commits;
* the other ranks (followers) never touch the mailbox. Each ``step()`` is a collective: the
  leader broadcasts whether its parameters changed outside the optimizer during that step (an
  alignment), and if so, all of them (one broadcast per parameter, in name order), so that the
  ranks enter the next step identical. ``open()`` and ``close()`` broadcast the parameters too.
* samples: each rank passes its own batch to ``step(samples=...)``; the leader reports
  ``samples × world size`` (DDP's ranks train equal batches), so the group weighs as one
  learner with the global batch.

Cost per step: one broadcast of one integer from rank 0, plus, per alignment (one fragment's
commit, about every ``H / fragments`` steps), one broadcast of the model (not yet measured
against bare DDP: docs/session.md). Every rank must call ``step()`` the same number of times and
leave the ``with`` block together, as for any collective. FSDP (sharded parameters) is not
supported yet: the leader would need every shard (``full_tensor``) to publish.
"""

from __future__ import annotations

import logging
import os
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


class GroupLink:
    """This rank's link to the other ranks of its learner (module docstring)."""

    def __init__(self, dist: Any, group: Any = None) -> None:
        self._dist = dist
        self._group = group
        self.rank = int(dist.get_rank(group))
        self.world_size = int(dist.get_world_size(group))
        self.broadcasts = 0
        """Parameter broadcasts (alignments, open, close) so far."""

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def step(self, changed: bool, model: Any) -> None:
        """The per-step collective: the leader says whether its parameters changed (and then
        sends them); a follower learns it (and receives them)."""
        import torch

        flag = torch.tensor([1 if changed else 0], dtype=torch.int64)
        self._dist.broadcast(flag, src=self._source(), group=self._group)
        if int(flag.item()):
            self.share_model(model)

    def share_model(self, model: Any) -> None:
        """Broadcast every parameter from the leader, in name order (a collective)."""
        import torch

        with torch.no_grad():
            for _, tensor in sorted(model.named_parameters(), key=lambda item: item[0]):
                self._dist.broadcast(tensor.data, src=self._source(), group=self._group)
        self.broadcasts += 1

    def share_object(self, value: Any) -> Any:
        """The leader's ``value`` on every rank (a small picklable object; a collective)."""
        box = [value]
        self._dist.broadcast_object_list(box, src=self._source(), group=self._group)
        return box[0]

    def _source(self) -> int:
        return 0 if self._group is None else self._dist.get_global_rank(self._group, 0)


def detect_group(group: Any, backend_name: str) -> GroupLink | None:
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
    link = GroupLink(dist, None if group == "auto" else group)
    if link.world_size == 1:
        return None
    log.info("rank %d of %d: %s", link.rank, link.world_size, "the group's learner" if link.is_leader else "following rank 0")
    return link
