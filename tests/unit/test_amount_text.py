"""The text of an amount in a request_id's fingerprint: one per value, for any decimal."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cluster.model.keys import amount_text, request_fingerprint


@pytest.mark.parametrize(
    ("given", "text"),
    [
        ("0", "0"),
        ("-0.00e5", "0"),
        ("12.30", "12.3"),
        ("1.5e0", "1.5"),
        ("150", "150"),
        ("1e2", "100"),
        ("0.0000001", "0.0000001"),
        ("1e30", "1000000000000000000000000000000"),
        ("1e31", "1e31"),
        ("7.43e19498076624", "743e19498076622"),
        ("7.4300e19498076624", "743e19498076622"),
        ("1.0e-999999", "1e-999999"),
        ("-2.50e-40", "-25e-41"),
    ],
)
def test_amount_text(given: str, text: str) -> None:
    assert amount_text(Decimal(given)) == text


def test_forms_of_one_amount_share_a_fingerprint_and_others_do_not() -> None:
    def of(amount: str) -> str:
        return request_fingerprint("payments", None, 1, Decimal(amount))

    assert of("7.43e19498076624") == of("743.0e19498076622")
    assert of("7.43e19498076624") != of("7.44e19498076624")
    assert of("49999.50") == of("4.999950e4")
