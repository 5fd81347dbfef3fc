"""`redis+sentinel://` URLs: what a node is given to find its primary through Sentinel."""

from __future__ import annotations

import re

import pytest

from cluster.model.sentinel_url import SentinelUrl, parse_sentinel_url, sentinel_url


def test_sentinels_master_database_and_credentials_are_read() -> None:
    assert parse_sentinel_url("redis+sentinel://:s%40cret@a:26379,b:26380/shard-1/2") == (
        SentinelUrl((("a", 26379), ("b", 26380)), "shard-1", 2, None, "s@cret")
    )
    assert parse_sentinel_url("redis+sentinel://127.0.0.1:5000/n1") == SentinelUrl(
        (("127.0.0.1", 5000),), "n1"
    )


def test_a_url_made_here_reads_back() -> None:
    made = sentinel_url([("127.0.0.1", 1), ("127.0.0.1", 2)], "n3")
    assert made == "redis+sentinel://127.0.0.1:1,127.0.0.1:2/n3"
    assert parse_sentinel_url(made).sentinels == (("127.0.0.1", 1), ("127.0.0.1", 2))


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("redis://a:1/0", "not a redis+sentinel:// URL"),
        ("redis+sentinel:///n1", "no Sentinel addresses"),
        ("redis+sentinel://a/n1", "a Sentinel is host:port, not 'a'"),
        ("redis+sentinel://a:99999/n1", "a Sentinel is host:port, not 'a:99999'"),
        ("redis+sentinel://a:1", "the path must name the master"),
        ("redis+sentinel://a:1/n1/x", "the database must be a number, not 'x'"),
    ],
)
def test_a_bad_url_is_refused_saying_why(url: str, says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_sentinel_url(url)
