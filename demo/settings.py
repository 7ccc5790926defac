"""The demo's defaults, in one place: sized so ``python -m demo`` takes a few
minutes on a 2-core machine (3 learners + the baseline) and the loss falls well below ln 256.
"""

from __future__ import annotations

LEARNERS = 3
STEPS = 500
"""Local steps per learner. A step is ~0.08 s of one core; with 3 learners and the baseline on
2 cores each learner makes ~3 steps/s, and the run takes about 2.5 minutes."""
QUICK_STEPS = 40
"""``--quick``: enough for a few rounds per fragment, for tests."""
QUICK_SYNC_EVERY = 12
"""H under ``--quick``: a round every 4 steps per learner with 3 fragments."""
SYNC_EVERY = 30
"""H: local steps between two exchanges of one fragment (short, so rounds show up often)."""
FRAGMENTS = 3
"""P: fragments, exchanged staggered: one round every H/P = 10 steps per learner."""
QUORUM = 2
"""K, contributions a round waits for (at most the number of learners). With 3 learners, K = 2
reached a validation loss ~0.06 lower than K = 1 after 300 steps (rounds of K = 1 often
merge one learner's few steps) and about the same as K = 3, while a slow learner (MLX on a
Linux CPU) still cannot hold the run back."""
OUTER_LR = 0.7
"""Nesterov outer learning rate (the library's default)."""
OUTER_MOMENTUM = 0.9
"""Nesterov outer momentum (the library's default)."""
BATCH_SIZE = 16
"""Windows per learner step; the baseline takes learners × this per step."""
LEARNING_RATE = 2e-3
"""AdamW (inner) learning rate, constant."""
EVAL_WINDOWS = 128
"""Validation windows (of the model's context) every process evaluates: the same set for all."""
REPORT_EVERY = 10
"""Steps between two progress lines of a process."""
