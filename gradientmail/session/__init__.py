"""The learner side: ``Session`` around the user's training loop."""

from gradientmail.session.session import Session, SessionOptions, default_learner_id

__all__ = ["Session", "SessionOptions", "default_learner_id"]
