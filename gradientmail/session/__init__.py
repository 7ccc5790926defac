"""The learner side: ``Session`` around the user's training loop."""

from gradientmail.session.session import Session, SessionOptions, SessionStats

__all__ = ["Session", "SessionOptions", "SessionStats"]
