"""Lease ids (cluster/model/lease_ids.py): what the router hands out it reads back, and
the pattern the OpenAPI document states accepts exactly the ids the router reads."""

from __future__ import annotations

import jsonschema_rs

from cluster.model.lease_ids import LEASE_ID_PATTERN, NONCE_BITS, lease_id, parse_lease_id


def test_an_id_names_its_fencing_value_and_nonce() -> None:
    for fencing, nonce in ((1, 0), (17, 0x3F9A0C2B11DE), (10**15 - 1, 2**NONCE_BITS - 1)):
        text = lease_id(fencing, nonce)
        assert parse_lease_id(text) == (fencing, nonce)
    assert lease_id(17, 0x3F9A0C2B11DE) == "17.3f9a0c2b11de"


def test_the_documented_pattern_accepts_exactly_what_the_router_reads() -> None:
    schema = jsonschema_rs.Draft202012Validator({"type": "string", "pattern": LEASE_ID_PATTERN})
    values = [
        "1.000000000000",
        "17.3f9a0c2b11de",
        "999999999999999.ffffffffffff",
        "1000000000000000.ffffffffffff",  # a fencing value past 10**15
        "0.000000000000",
        "01.000000000000",
        "1.3F9A0C2B11DE",  # upper case
        "1.3f9a0c2b11d",
        "1.3f9a0c2b11de0",
        "1.3f9a0c2b11de\n",
        "\u0661.000000000000",  # an Arabic-Indic one
        "",
        "1",
        "1:3f9a0c2b11de",
    ]
    verdicts = [
        (value, schema.is_valid(value), parse_lease_id(value) is not None) for value in values
    ]
    assert [v for v in verdicts if v[1] != v[2]] == []
    assert [value for value, valid, _ in verdicts if valid] == values[:3]
    assert parse_lease_id(17) is None and parse_lease_id(None) is None
