"""The strided fragment layout (Streaming DiLoCo's: blocks dealt round the fragments) beside the
balanced one, recorded in the manifest and checked when a node joins."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import gradientmail as gm
from gradientmail.algorithms.fragments import block_of, plan_fragments
from gradientmail.store import RunStore

NAMES = ["tok.weight", "pos.weight"] + [f"blocks.{i}.{p}" for i in range(6) for p in ("attn.w", "mlp.w", "ln.w")]
NAMES += ["ln_f.weight", "head.weight"]


def _sizes() -> list[tuple[str, int]]:
    big = {"tok.weight": 3000, "head.weight": 2900, "pos.weight": 200}
    return [(n, big.get(n, 1000 if "mlp" in n else 500 if "attn" in n else 10)) for n in NAMES]


def test_blocks_are_dealt_round_the_fragments_and_the_rest_balanced() -> None:
    plan = plan_fragments(_sizes(), 3, "strided")
    blocks = [sorted({block_of(n)[1] for n in group if block_of(n) is not None}) for group in plan.fragments]  # type: ignore[index]
    assert sorted(blocks) == [[0, 3], [1, 4], [2, 5]]
    assert sorted(n for group in plan.fragments for n in group) == sorted(NAMES)
    for group in plan.fragments:
        assert list(group) == sorted(group, key=NAMES.index)  # model order within a fragment
        for name in group:  # a block travels whole
            block = block_of(name)
            assert block is None or all(n in group for n in NAMES if block_of(n) == block)
    firsts = [NAMES.index(group[0]) for group in plan.fragments]
    assert firsts == sorted(firsts)  # numbered by model position
    # the two large outside tensors go to different fragments (largest first, lightest fragment)
    assert not any("tok.weight" in g and "head.weight" in g for g in plan.fragments)
    assert plan == plan_fragments(_sizes(), 3, "strided")
    assert plan != plan_fragments(_sizes(), 3, "by_bytes")


def test_block_names_of_common_models() -> None:
    assert block_of("model.layers.12.mlp.down_proj.weight") == ("model.layers", 12)
    assert block_of("transformer.h.3.attn.c_attn.weight") == ("transformer.h", 3)
    assert block_of("0.weight") == ("", 0)  # nn.Sequential
    assert block_of("lm_head.weight") is None and block_of("w2v") is None


def test_a_strided_plan_needs_as_many_blocks_as_fragments_and_a_known_layout() -> None:
    with pytest.raises(gm.InvalidConfig, match="need at least 8 blocks, the model has 6; use 'by_bytes'"):
        plan_fragments(_sizes(), 8, "strided")
    with pytest.raises(gm.InvalidConfig, match="fragment_layout"):
        plan_fragments(_sizes(), 2, "sequential")
    with pytest.raises(gm.InvalidConfig, match="fragment_layout"):
        gm.DiLoCo(fragment_layout="sequential")  # type: ignore[arg-type]


def _model() -> dict[str, np.ndarray]:
    return {name: np.zeros(size, np.float32) for name, size in _sizes()}


def test_the_layout_is_the_runs_and_a_node_with_another_is_refused(tmp_path: Path) -> None:
    box = gm.FileMailbox(tmp_path / "box")
    options = gm.SessionOptions(lease_ttl_s=1.0, poll_interval_s=0.02)
    strided = gm.DiLoCo(sync_every=4, fragments=3, fragment_layout="strided", overlap_steps=0)
    model = _model()

    def step(batch: int) -> int:
        for array in model.values():
            array -= np.float32(0.001 * (batch + 1))
        return 2

    gm.Session(model, algorithm=strided, mailbox=box, learner_id="a", options=options).run(step, range(13))
    spec = RunStore(box).read_spec()
    assert spec.manifest.algorithm["fragment_layout"] == "strided"
    assert tuple(tuple(f) for f in spec.fragments) == plan_fragments(_sizes(), 3, "strided").fragments
    assert all(RunStore(box).newest_version(f) >= 2 for f in range(3))
    other = gm.DiLoCo(sync_every=4, fragments=3, overlap_steps=0)
    joiner = gm.Session(_model(), algorithm=other, mailbox=box, learner_id="b", options=options)
    with pytest.raises(gm.RunConfigMismatch, match="fragment_layout: the run uses 'strided', this node 'by_bytes'"):
        joiner.open()
