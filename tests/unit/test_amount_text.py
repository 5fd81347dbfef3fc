"""The text of an amount in a request_id's fingerprint: one per value, for any decimal."""

from __future__ import annotations

from decimal import Decimal

import pytest

from cluster.model.errors import Problems
from cluster.model.keys import amount_text, request_fingerprint
from cluster.model.limit_values import to_minor_units


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


@pytest.mark.parametrize(
    ("given", "minor"),
    [
        ("0", 0),
        ("0e-99999999", 0),
        ("49999.50", 4999950),
        ("4.999950e4", 4999950),
        ("0.01", 1),
        ("0.001", None),
        ("1e-3", None),
        ("1e-1000001", None),
        ("1e-99999999", None),
        ("1e-99999999999999999", None),
    ],
)
def test_an_amount_in_minor_units_or_refused_for_its_decimals(
    given: str, minor: int | None
) -> None:
    problems = Problems()
    assert to_minor_units(Decimal(given), 2, "amount", problems) == minor
    refused = [error.message for error in problems.errors]
    assert refused == ([] if minor is not None else ["has more than 2 decimal places"])
