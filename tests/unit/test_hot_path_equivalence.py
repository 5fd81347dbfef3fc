"""The hot path's shortcuts answer exactly as the general code they stand in for."""

from __future__ import annotations

import itertools
from pathlib import Path

import orjson

from cluster.model import answers
from cluster.model.errors import Problems
from cluster.model.limits import LimitSpec, parse_limits
from cluster.model.ratelimit_headers import HeaderPlan, LimitState, header_values
from router.api.check_bodies import decode_check, decode_check_batch
from router.requests import parse_check, parse_check_batch
from router.rules.book import RuleBook

LIMITS = [
    {"algorithm": "fixed_window", "limit": 10, "window": "1m"},
    {"algorithm": "token_bucket", "rate": 1, "period": "2s", "burst": 5},
    {"algorithm": "sliding_window", "limit": 3, "window": "10s"},
]


def _specs(data: list[dict[str, object]]) -> tuple[LimitSpec, ...]:
    problems = Problems()
    specs = parse_limits(data, "limits", problems)
    assert not problems.errors, problems.errors
    return specs


def _view(state: LimitState) -> answers.LimitState:
    return answers.LimitState(
        algorithm="-",
        limit=state.limit,
        remaining=state.remaining,
        reset_after_ms=state.reset_after_ms,
    )


def test_one_limit_headers_match_header_values() -> None:
    values = (None, 0, 1, 4, 5, 10, 11)
    resets = (None, 0, 1, 999, 1000, 1001, 59_999)
    for data in LIMITS:
        specs = _specs([data])
        plan = HeaderPlan("r", specs)
        for limit, remaining, reset, retry in itertools.product(
            values, values, resets, (None, 1, 1500)
        ):
            state = LimitState(limit, remaining, reset)
            view = _view(state)
            assert plan.values([view], retry) == header_values("r", specs, [state], retry)


def test_two_limit_headers_match_header_values() -> None:
    specs = _specs(LIMITS[:2])
    plan = HeaderPlan("r", specs)
    states = [LimitState(10, 3, 5000), LimitState(5, 0, 1500)]
    views = [_view(state) for state in states]
    assert plan.values(views, 1500) == header_values("r", specs, states, 1500)


def test_common_checks_decode_as_the_full_parser_parses(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  basic:\n    limits: [{algorithm: fixed_window, limit: 5, window: 1m}]\n"
    )
    book = RuleBook(path)
    book.load()
    inline = '[{"algorithm":"fixed_window","limit":3,"window":"1s"}]'
    bodies = [
        '{"key":"u:1","rule":"basic"}',
        '{"key":"u:1","rule":"basic","cost":0,"dry_run":true}',
        '{"key":"u:2","limits":' + inline + ',"cost":7}',
        '{"key":"u:2","limits":' + inline + ',"on_failure":"deny"}',
        '{"key":"u:3","rule":"basic","request_id":"r-1"}',
    ]
    for text in bodies:
        problems = Problems()
        full = parse_check(orjson.loads(text), book, problems)
        assert not problems.errors and full is not None
        assert decode_check(text.encode(), book) == full


def test_common_batches_decode_as_the_full_parser_parses(tmp_path: Path) -> None:
    path = tmp_path / "rules.yaml"
    path.write_text(
        "rules:\n  basic:\n    limits: [{algorithm: fixed_window, limit: 5, window: 1m}]\n"
        "  hot:\n    spread: 4\n    limits: [{algorithm: fixed_window, limit: 40, window: 1m}]\n"
    )
    book = RuleBook(path)
    book.load()
    inline = '[{"algorithm":"fixed_window","limit":3,"window":"1s"}]'
    bodies = [
        '{"checks":[{"key":"u:1","rule":"basic"},{"key":"u:2","rule":"hot","cost":2}]}',
        '{"checks":[{"key":"u:1","rule":"basic","request_id":"r-1"},'
        '{"key":"u:2","limits":' + inline + ',"dry_run":true}],"all_or_nothing":true}',
    ]
    for text in bodies:
        problems = Problems()
        full = parse_check_batch(orjson.loads(text), book, problems)
        assert not problems.errors and full[0]
        assert decode_check_batch(text.encode(), book) == full


def test_inline_limits_padded_to_a_large_text_are_read_but_not_kept(tmp_path: Path) -> None:
    """The inline-limits cache keeps short texts only: a client padding its limits with a
    megabyte of spaces, differently each time, would otherwise make the router keep it."""
    from router.api import check_bodies

    rules = RuleBook(tmp_path / "rules.yaml")
    limit = b'{"algorithm":"fixed_window","limit":10,"window":"1m"}'
    kept = len(check_bodies._inline)
    for pad in range(1, 4):
        body = b'{"key":"k","limits":[' + limit + b" " * (100_000 + pad) + b"]}"
        assert decode_check(body, rules).rule.limits[0].limit == 10
    assert len(check_bodies._inline) == kept
    decode_check(b'{"key":"k","limits":[' + limit + b"  ]}", rules)  # a text not seen yet
    assert len(check_bodies._inline) == kept + 1
