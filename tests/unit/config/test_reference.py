"""docs/config.md is the schema's reference, up to date, and no key is accepted and ignored."""

from __future__ import annotations

import pathlib

from rltrain.config import reference

ROOT = pathlib.Path(__file__).resolve().parents[3]


def test_docs_config_md_is_up_to_date():
    want = reference.render()
    have = (ROOT / "docs" / "config.md").read_text()
    assert have == want, "regenerate: python -m rltrain.config.reference > docs/config.md"


def test_every_key_is_read_outside_validation():
    assert reference.unread_keys() == [], (
        "these keys are validated but read by no module: wire them or remove them"
    )


def test_every_key_is_documented():
    assert [k.key for k in reference.keys() if not k.doc] == []


def test_keys_read_by_name_are_named_where_the_docs_say():
    for key, modules in reference.DYNAMIC_READERS.items():
        name = key.rsplit(".", 1)[-1]
        for module in modules:
            source = (ROOT / f"{module}.py").read_text()
            assert name in source, f"{module}.py does not mention {name!r} ({key})"


def test_the_reader_scan_sees_a_direct_read():
    readers = reference.find_readers()
    assert "rltrain/workers/actor" in readers["simulate.actor_latency_ms"]
    assert "rltrain/runners/checkpoint" in readers["trainer.resume"]
