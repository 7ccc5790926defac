"""One record shape: a version's draft is the round record less the fields the store adds.

``records.RoundContent`` is what the writer of a version decides; ``RoundRecord.committed`` adds
the store's fields (``STORE_ADDED_FIELDS``: the blob references, who committed it in which term,
when, the count of rejections past those listed). The two declare each shared field alike —
name, type, default and bounds — so a new field of the record is declared in both (this test
fails until it is) and set by the writer alone; the store copies the content whole."""

from __future__ import annotations

from gradientmail.records import STORE_ADDED_FIELDS, PayloadRef, Rejection, RoundContent, RoundRecord, RoundTiming
from gradientmail.records.models import MAX_LISTED_REJECTIONS

EVERY_RECORD = {"schema_version", "mac"}


def test_the_content_is_the_record_less_the_stores_fields() -> None:
    assert set(RoundContent.model_fields) == set(RoundRecord.model_fields) - STORE_ADDED_FIELDS - EVERY_RECORD
    assert set(RoundRecord.model_fields) >= STORE_ADDED_FIELDS


def test_each_shared_field_is_declared_alike() -> None:
    for name, field in RoundContent.model_fields.items():
        ours = RoundRecord.model_fields[name]
        assert (field.annotation, field.default, field.default_factory, field.metadata) == (
            ours.annotation, ours.default, ours.default_factory, ours.metadata,
        ), name  # fmt: skip


def test_a_committed_record_holds_the_content_whole_and_bounds_the_rejections() -> None:
    rejected = tuple(
        Rejection(learner=f"l{i}", contribution=f"k{i}", reason="stale", detail="old") for i in range(MAX_LISTED_REJECTIONS + 2)
    )
    content = RoundContent(
        fragment=1, version=4, base_version=3, rejected=rejected, merge={"kind": "rda"}, outer_lr=0.7, outer_momentum=0.9,
        timing=RoundTiming(grace_s=0.5), backend="numpy",
    )  # fmt: skip
    ref = PayloadRef(key="fragments/0001/versions/x.safetensors", sha256="0" * 64, size_bytes=8)
    record = RoundRecord.committed(content, params=ref, outer_state=ref, update=None, committed_by="node", term=2)
    for name in RoundContent.model_fields:
        if name != "rejected":
            assert getattr(record, name) == getattr(content, name), name
    assert len(record.rejected) == MAX_LISTED_REJECTIONS and record.rejections_omitted == {"stale": 2}
    assert (record.committed_by, record.term, record.params) == ("node", 2, ref)
