"""A torchrun rank other than 0: it trains its part of the learner's batch and follows rank 0.

Rank 0 is the learner (it joins the run, publishes and aligns); a follower takes part in its
collectives only: at open the full model's gather (FSDP) and the committed parameters' scatter,
then the run's id (its own learner state is saved under it), in each step whatever rank 0
gathers or scatters until it says the step is done, and at close rank 0's last step.
"""

from __future__ import annotations

from gradientmail.session.group import GroupLink

__all__ = ["FollowerRank"]


class FollowerRank:
    """This rank's part in rank 0's session (module docstring)."""

    def __init__(self, link: GroupLink) -> None:
        self._link = link
        self.rank = link.rank
        self.following = False
        """Between ``open`` and ``close``."""

    def open(self) -> str | None:
        """Join rank 0's open; the run's id."""
        link = self._link
        link.gather(link.names, command=False)
        link.scatter(link.names, command=False)
        self.following = True
        run_id: str | None = link.share_object(None)
        return run_id

    def step(self) -> None:
        """Take part in rank 0's step."""
        self._link.follow_step()

    def close(self, wait: bool) -> None:
        """Take part in rank 0's close (its gathers for a final publish, the newest commit)."""
        if self.following:
            self.following = False
            if wait:
                self._link.follow_step()
