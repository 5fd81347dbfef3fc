"""The descriptors files of envoyproxy/ratelimit's test/config (copied verbatim into
envoy_upstream_config/): every file its config_test.go refuses is refused here with its
message, and the files it loads load."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster.model.errors import ValidationError
from router.envoy.descriptors import ParseOptions, limit_key, match, parse_text

FILES = Path(__file__).parent / "envoy_upstream_config"


def load(*names: str, merge: bool = False) -> dict[str, object]:
    text = "\n---\n".join((FILES / name).read_text() for name in names)
    return parse_text(text, ParseOptions(merge_domains=merge))  # type: ignore[return-value]


@pytest.mark.parametrize(
    ("names", "message"),
    [
        (("empty_domain.yaml",), "config file cannot have empty domain"),
        (
            ("basic_config.yaml", "duplicate_domain.yaml"),
            "duplicate domain 'test-domain' in config file",
        ),
        (("empty_key.yaml",), "descriptor has empty key"),
        (("duplicate_key.yaml",), "duplicate descriptor composite key 'test-domain.key1_value1'"),
        (("bad_limit_unit.yaml",), "invalid rate limit unit 'foo'"),
        (("replaces_self.yaml",), "replaces should not contain name of same descriptor"),
        (("replaces_empty.yaml",), "should not have an empty replaces entry"),
        (("misspelled_key.yaml",), "config error, unknown key 'ratelimit'"),
        (("misspelled_key2.yaml",), "config error, unknown key 'requestsperunit'"),
        (("non_string_key.yaml",), "config error, key is not of type string: 0.25"),
        (("non_map_list.yaml",), "config error, yaml file contains list of type other than map: a"),
        (("unlimited_with_unit.yaml",), "should not specify rate limit unit when unlimited"),
    ],
)
def test_upstream_refusals(names: tuple[str, ...], message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        load(*names)
    assert caught.value.errors[0].message == message  # upstream stops at the first


def test_bad_yaml_refused() -> None:
    with pytest.raises(yaml.YAMLError):
        load("bad_yaml.yaml")


def test_more_refusals_from_config_impl() -> None:
    """share_threshold without a wildcard, a float leaf, a wrong type."""
    cases = {
        "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n": (
            "share_threshold can only be used with wildcard values (containing '*'), "
            "but found key 'k_v'"
        ),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1.5}\n": (
            "error checking config: 1.5 is a float; a value here must be a string, an "
            "integer or a boolean"
        ),
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: -1}\n": (
            "must be an integer from 0 to 4294967295"
        ),
        "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: sure\n": "must be true or false",
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {since: 2020-01-01}\n": (
            "error parsing metadata: invalid type: date"
        ),
    }
    for text, message in cases.items():
        with pytest.raises(ValidationError) as caught:
            parse_text(text)
        assert [e.message for e in caught.value.errors] == [message], text


def test_upstream_accepted_files_load() -> None:
    domains = load("basic_config.yaml")
    found = match(domains, "test-domain", [("key1", "value1"), ("subkey1", "something")])  # type: ignore[arg-type]
    assert found is not None and found.limit.requests_per_unit == 5
    assert found.limit.stats_key == "key1_value1.subkey1"
    for name in (
        "shadowmode_config.yaml",
        "share_threshold.yaml",
        "wildcard.yaml",
        "metadata.yaml",
    ):
        assert list(load(name)) == ["test-domain"]
    merged = load("merge_domain_key1.yaml", "merge_domain_key2.yaml", merge=True)
    two = match(merged, "test-domain", [("key2", "value2")])  # type: ignore[arg-type]
    assert two is not None and two.limit.requests_per_unit == 20
    with pytest.raises(ValidationError):
        load("merge_domain_key1.yaml", "merge_domain_key1.yaml", merge=True)
    # unlimited with requests_per_unit but no unit: accepted there, and here.
    assert parse_text(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true, requests_per_unit: 5}\n"
    )


def test_upstream_wildcard_config() -> None:
    """config_test.go TestWildcardConfig on wildcard.yaml: which values match, and the
    stat key (the pattern, never the value)."""
    domains = load("wildcard.yaml")

    def stats_key(*entries: tuple[str, str]) -> str | None:
        found = match(domains, "test-domain", list(entries))  # type: ignore[arg-type]
        return None if found is None else found.limit.stats_key

    assert stats_key(("noVal", "foo1")) == stats_key(("noVal", "foo2")) == "noVal"
    assert stats_key(("wild", "foo1")) == stats_key(("wild", "foo2")) == "wild_foo*"
    assert stats_key(("nestedWild", "val1"), ("wild", "goo2")) == "nestedWild_val1.wild_goo*"
    assert stats_key(("wild", "bar")) is None
    assert stats_key(("noWild", "foo1")) is None
    assert stats_key(("midWild", "barab")) == stats_key(("midWild", "bar123b")) == "midWild_bar*b"
    assert stats_key(("midWild", "barb")) == "midWild_bar*b"  # * matches nothing too
    assert stats_key(("midWild", "bara")) is None
    assert stats_key(("midWild", "xbarb")) is None
    multi = "multiWild_foo*bar*baz"
    assert (
        stats_key(("multiWild", "foo123bar456baz"))
        == stats_key(("multiWild", "foobarbaz"))
        == multi
    )
    assert stats_key(("multiWild", "foo123baz")) is None
    assert stats_key(("multiWild", "bar456baz")) is None


def test_upstream_share_threshold_counters() -> None:
    """config_test.go TestShareThreshold on share_threshold.yaml: the counter (limit key)
    uses the wildcard pattern for each entry matched by a share_threshold wildcard, at
    any depth, and the runtime value elsewhere."""
    domains = load("share_threshold.yaml")

    def counter(*entries: tuple[str, str]) -> str | None:
        found = match(domains, "test-domain", list(entries))  # type: ignore[arg-type]
        return None if found is None else found.key

    def key(*entries: tuple[str, str]) -> str:
        return limit_key("test-domain", list(entries))

    assert counter(("files", "files/a.pdf")) == counter(("files", "files/b.csv"))
    assert counter(("files", "files/a.pdf")) == key(("files", "files/*"))
    assert counter(("nested", "parent"), ("files", "nested/x")) == key(
        ("nested", "parent"), ("files", "nested/*")
    )
    assert counter(("files", "top/a"), ("files", "nested/b")) == key(
        ("files", "top/*"), ("files", "nested/*")
    )
    assert counter(("path", "path/a"), ("file", "file/b"), ("type", "t")) == key(
        ("path", "path/*"), ("file", "file/b"), ("type", "t")
    )
    assert counter(("file", "test1")) == key(("file", "test1"))  # the exact value first
    assert counter(("file", "test2")) == key(("file", "test*"))
    assert counter(("midpath", "/api/x/v1")) == key(("midpath", "/api*v1"))
    assert counter(("multiroute", "svcAepBrpc")) == key(("multiroute", "svc*ep*rpc"))
