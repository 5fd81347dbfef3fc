"""Amounts in a rules file are read as written: exact decimals, never floats."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from router.rules.book import RulesFileError, read_rules_file, rules_document


def _rules(tmp_path: Path, max_amount: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  pay:\n    limits:\n"
        f"      - {{algorithm: calendar, period: day, max_amount: {max_amount}}}\n"
    )
    return path


def test_a_max_amount_with_more_decimals_than_its_scale_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RulesFileError) as refused:
        read_rules_file(_rules(tmp_path, "100.000000000000001"))
    assert "has more than 2 decimal places" in str(refused.value)


def test_a_max_amount_written_as_a_yaml_number_is_kept_exactly(tmp_path: Path) -> None:
    rules = read_rules_file(_rules(tmp_path, "49950.50"))
    limit = rules_document(rules)["pay"]["limits"][0]
    assert limit["max_amount"] == "49950.50"
    assert orjson.loads(orjson.dumps(rules_document(rules))) == rules_document(rules)
