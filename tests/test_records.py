"""Typed records: round trips, refusal of malformed and unknown-version records, key layout."""

from __future__ import annotations

import json

import pytest

import gradientmail as gm
from gradientmail.records import Contribution, Lease, Manifest, ParameterSpec, PayloadRef, RoundRecord, keys

SHA = "ab" * 32


def manifest() -> Manifest:
    return Manifest(
        run_id="run-1",
        algorithm=gm.DiLoCo(fragments=2).to_manifest(),
        parameters=(
            ParameterSpec(name="a", shape=(2, 3), dtype="float32"),
            ParameterSpec(name="b", shape=(3,), dtype="bfloat16"),
        ),
        plan=(("a",), ("b",)),
        created_by="node-0",
    )


def contribution(**changes) -> Contribution:
    fields = dict(
        learner="node-1",
        fragment=0,
        anchor_version=4,
        steps=12,
        samples=3072,
        payload=PayloadRef(
            key="fragments/0000/contributions/0000000004/node-1-0000000001.safetensors", sha256=SHA, size_bytes=100
        ),
    )
    fields.update(changes)
    return Contribution(**fields)


def round_record() -> RoundRecord:
    return RoundRecord(
        fragment=0,
        version=5,
        base_version=4,
        merge={"kind": "rda", "direct_pattern": "embed"},
        outer_lr=0.7,
        outer_momentum=0.9,
        participants=({"learner": "node-1", "contribution": "k", "steps": 12, "samples": 3072, "weight": 786432.0},),
        rejected=({"learner": "node-2", "contribution": "k2", "reason": "stale", "detail": "based on 3"},),
        params=PayloadRef(key="p", sha256=SHA, size_bytes=1),
        outer_state=PayloadRef(key="o", sha256=SHA, size_bytes=1),
        committed_by="node-0",
        term=2,
    )


@pytest.mark.parametrize(
    "record", [manifest(), contribution(), round_record(), Lease(kind="syncer", holder="node-0", term=3, ttl_s=10.0)]
)
def test_round_trip(record):
    assert type(record).from_json(record.to_json()) == record
    assert json.loads(record.to_json())["schema_version"] == 1


def test_manifest_merge_is_stored_in_its_manifest_form():
    """INV-8: the manifest stores the merge in its manifest form."""
    assert json.loads(manifest().to_json())["algorithm"]["merge"] == {"kind": "rda", "direct_pattern": "embed"}


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"{not json", "not JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"schema_version": 99}', "schema_version 99"),
        (b'{"kind": "learner"}', "schema_version None"),
    ],
)
def test_malformed_records_are_refused(data, problem):
    """INV-7: records that are not JSON objects or have an unknown schema version are refused."""
    with pytest.raises(gm.InvalidRecord, match=problem):
        Lease.from_json(data)


def test_wrong_field_types_and_unknown_fields_are_named():
    """INV-7: mis-typed and unknown fields are refused, naming the field."""
    raw = json.loads(contribution().to_json())
    raw["steps"] = "twelve"
    with pytest.raises(gm.InvalidRecord, match="steps"):
        Contribution.from_json(json.dumps(raw))
    raw = json.loads(contribution().to_json())
    raw["surprise"] = 1
    with pytest.raises(gm.InvalidRecord, match="surprise"):
        Contribution.from_json(json.dumps(raw))
    raw = json.loads(contribution().to_json())
    raw["payload"]["sha256"] = "xyz"
    with pytest.raises(gm.InvalidRecord, match="sha256"):
        Contribution.from_json(json.dumps(raw))


@pytest.mark.parametrize("learner", ["../etc", "/abs", "a/b", "", ".hidden", "x" * 65, "sp ace"])
def test_path_like_learner_ids_are_refused(learner):
    """INV-7: path-like learner ids are refused in records and keys."""
    raw = json.loads(contribution().to_json())
    raw["learner"] = learner
    with pytest.raises(gm.InvalidRecord, match="learner"):
        Contribution.from_json(json.dumps(raw))
    with pytest.raises(gm.InvalidKey):
        keys.learner_lease(learner)


def test_manifest_plan_must_partition_the_parameters():
    """INV-7: a manifest whose plan does not partition the parameters is refused."""
    raw = json.loads(manifest().to_json())
    raw["plan"] = [["a"]]
    with pytest.raises(gm.InvalidRecord, match="plan"):
        Manifest.from_json(json.dumps(raw))


def test_oversized_record_is_refused_before_parsing():
    """INV-7: an oversized record is refused before parsing."""
    with pytest.raises(gm.InvalidRecord, match="limit"):
        Lease.from_json(b" " * (16 * 1024 * 1024 + 1))


def test_key_layout_sorts_numerically_and_parses_back():
    versions = [keys.round_record(1, v) for v in (2, 10, 100, 9)]
    assert sorted(versions) == [keys.round_record(1, v) for v in (2, 9, 10, 100)]
    assert keys.parse_round_record(keys.round_record(7, 123)) == keys.RoundKey(7, 123)
    assert keys.parse_round_record(keys.MANIFEST) is None
    parsed = keys.parse_contribution_record(keys.contribution_record(2, 5, "node-a", 7))
    assert parsed == keys.ContributionKey(2, 5, "node-a", 7)
    assert keys.contribution_blob(2, 5, "node-a", 7).startswith(keys.contributions_prefix(2, 5))
    assert keys.params_blob(0, 1, "w1", "ab12") != keys.params_blob(0, 1, "w1", "cd34")
    assert keys.params_blob(0, 1, "x" * 64, "0123456789ab").endswith(".0123456789ab.safetensors")
    with pytest.raises(gm.InvalidKey):
        keys.params_blob(0, 1, "w1", "../x")


def test_a_learner_lease_key_parses_back_to_its_learner():
    """The store lists learners' leases by id: only a learner's own lease key parses, to that id."""
    assert keys.parse_learner_lease(keys.learner_lease("l0.a-b_c")) == "l0.a-b_c"
    for other in ("leases/syncer.json", "leases/learners/a/b.json", "leases/learners/.x.json", "leases/learners/a.txt"):
        assert keys.parse_learner_lease(other) is None
