"""Envoy rate-limit descriptors: envoyproxy/ratelimit's YAML format -> shardlimit rules.

One file holds one or more YAML documents, one per domain (`---` between them). A file
is refused as a whole for everything envoyproxy/ratelimit refuses (router/envoy/yaml_checks.py
and `_descriptor` below, in its order and with its messages). A descriptor is matched
as there: level by level, `key_value` first, then a wildcard (`*` matches any run of
characters), then `key` alone; a limit applies only at the depth of the request's last
entry.
"""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from cluster.model.errors import FieldError, Problems, ValidationError
from cluster.model.keys import MAX_KEY_BYTES
from cluster.model.limits import LimitSpec, parse_limits
from router.envoy import yaml_checks as doc
from router.envoy.settings import EnvoySettings
from router.rules.book import ON_FAILURE, Rule, make_rule
from router.rules.rejection import yaml_cause
from router.rules.watched_file import WatchedFile
from router.rules.yaml_text import not_utf8, strict_load_all

log = logging.getLogger("shardlimit.envoy")

# envoyproxy/ratelimit's units and their fixed, epoch-aligned windows (its UnitToDivider):
# a month is 30 days and a year 365 days there, and here too.
ENVOY_UNIT_MS: dict[str, int] = {
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 7 * 86_400_000,
    "month": 30 * 86_400_000,
    "year": 365 * 86_400_000,
}
# envoy_flags of a descriptor's limit: a denied hit is counted (1), the window's end is
# always reported (2). Both: envoyproxy/ratelimit's default.
COUNTED_DENIALS = 1
UPSTREAM_FLAGS = 3
_SCOPE_CHARS = re.compile(r"[^A-Za-z0-9_.:-]")
_KEY_ESCAPES = str.maketrans({"%": "%25", "|": "%7C", "=": "%3D", "{": "%7B", "}": "%7D"})


@dataclass(frozen=True)
class DescriptorLimit:
    """What a matched descriptor applies."""

    scope: str  # the rule name its counters are kept under
    rule: Rule | None  # rate_limit / limits; None with rule_ref, unlimited or blocked
    stats_key: str = ""  # envoyproxy/ratelimit's stat key below the domain: `k_v.k2`
    rule_ref: str | None = None  # `rule: NAME`: a cluster rule, looked up per request
    unlimited: bool = False
    blocked: bool = False  # requests_per_unit: 0, every counted hit is over the limit
    shadow_mode: bool = False
    quota_mode: bool = False
    name: str = ""
    replaces: tuple[str, ...] = ()
    requests_per_unit: int | None = None  # rate_limit form: reported as current_limit
    unit: str | None = None
    metadata: dict[str, Any] | None = None  # RESPONSE_DYNAMIC_METADATA, when it passes


@dataclass(frozen=True)
class ParseOptions:
    """How `rate_limit` descriptors are checked (router/envoy/settings.py)."""

    envoy_flags: int = UPSTREAM_FLAGS
    cache_denials: bool = False
    merge_domains: bool = False


def parse_options(settings: EnvoySettings) -> ParseOptions:
    """How the router reads its descriptors under its Envoy settings."""
    flags = 2 if settings.stop_increment_when_over_limit else 2 | COUNTED_DENIALS
    return ParseOptions(flags, settings.cache_denials, settings.merge_domains)


@dataclass
class Level:
    """One descriptor list, by envoyproxy/ratelimit's composite key (`key` or
    `key_value`), and its wildcard entries in file order."""

    nodes: dict[str, DescriptorNode] = field(default_factory=dict)
    wildcards: list[tuple[re.Pattern[str], str]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.nodes)


@dataclass
class DescriptorNode:
    composite: str  # `key` or `key_value`
    share_pattern: str | None  # share_threshold: the wildcard value every match counts as
    limit: DescriptorLimit | None
    children: Level


@dataclass(frozen=True)
class Match:
    limit: DescriptorLimit
    key: str  # the limit key: domain and the matched entries


def limit_key(domain: str, parts: list[tuple[str, str]]) -> str:
    """`<domain>|<key>=<value>|...` with % | = { } percent-encoded in every part (no
    hash tags, no ambiguity); longer than a limit key may be: `<domain>|sha256:<hex>`."""
    text = "|".join(
        [domain.translate(_KEY_ESCAPES)]
        + [f"{k.translate(_KEY_ESCAPES)}={v.translate(_KEY_ESCAPES)}" for k, v in parts]
    )
    if len(text.encode("utf-8", "surrogatepass")) <= MAX_KEY_BYTES:
        return text
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{domain.translate(_KEY_ESCAPES)[:400]}|sha256:{digest}"


def scope_name(domain: str, path: list[tuple[str, str | None]]) -> str:
    """A rule name (RULE_NAME) naming one config path: `envoy.<domain>.<12 hex>`.
    `rate_limit` descriptors all count under the domain's own (empty path): their
    counter is the request's entries and the unit's window, as envoyproxy/ratelimit's
    cache key, so a `limit` override with the same unit counts on the same counter."""
    canonical = "\x00".join([domain] + [f"{k}\x01{'' if v is None else v}" for k, v in path])
    digest = hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"envoy.{_SCOPE_CHARS.sub('_', domain)[:40]}.{digest}"


def rate_limit_rule(scope: str, count: int, unit: str, options: ParseOptions) -> Rule:
    spec = LimitSpec(
        "fixed_window", limit=count, window_ms=ENVOY_UNIT_MS[unit], envoy_flags=options.envoy_flags
    )
    return make_rule(scope, (spec,), "allow", cache_denials=options.cache_denials)


def _wildcard(composite: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in composite.split("*")), re.DOTALL)


class _Loader:
    """One file's documents -> domains, every problem collected."""

    def __init__(self, options: ParseOptions) -> None:
        self.options = options
        self.problems = Problems()

    def names(self, data: dict[str, Any], own: str, path: str) -> tuple[str, ...]:
        """`replaces: [{name: N}, ...]`: no empty name, not the limit's own."""
        replaces = []
        for index, entry in enumerate(doc.items(data, "replaces", path, self.problems)):
            here = f"{path}.replaces[{index}]"
            name = doc.text(entry, "name", here, self.problems) if isinstance(entry, dict) else ""
            if name == "":
                self.problems.add(here, "should not have an empty replaces entry")
            elif name == own:
                self.problems.add(here, "replaces should not contain name of same descriptor")
            replaces.append(name)
        return tuple(replaces)

    def rate_limit(
        self, data: dict[str, Any], base: DescriptorLimit, path: str
    ) -> DescriptorLimit | None:
        problems = self.problems
        unit = doc.text(data, "unit", path, problems).lower()
        valid_unit = unit in ENVOY_UNIT_MS
        unlimited = doc.flag(data, "unlimited", path, problems)
        if unlimited and valid_unit:
            problems.add(f"{path}.unit", "should not specify rate limit unit when unlimited")
        elif not unlimited and not valid_unit:
            problems.add(f"{path}.unit", f"invalid rate limit unit '{data.get('unit') or ''}'")
        count = doc.count(data, "requests_per_unit", path, problems)
        name = doc.text(data, "name", path, problems)
        limit = replace(base, name=name, replaces=self.names(data, name, path))
        if unlimited:
            return replace(limit, unlimited=True)
        if not valid_unit:
            return None
        rule = rate_limit_rule(limit.scope, count, unit, self.options) if count > 0 else None
        return replace(limit, rule=rule, blocked=count == 0, requests_per_unit=count, unit=unit)

    def descriptor(
        self,
        data: dict[str, Any],
        domain: str,
        parent: list[tuple[str, str | None]],
        stats_parent: str,
        level: Level,
        path: str,
    ) -> None:
        problems = self.problems
        key = doc.text(data, "key", path, problems)
        if key == "":
            problems.add(f"{path}.key", "descriptor has empty key")
            return
        value = doc.text(data, "value", path, problems)
        composite = f"{key}_{value}" if value else key
        stats_key = f"{stats_parent}.{composite}" if stats_parent else composite
        if composite in level.nodes:
            problems.add(path, f"duplicate descriptor composite key '{domain}.{stats_key}'")
            return
        here = [*parent, (key, value or None)]
        shadow = doc.flag(data, "shadow_mode", path, problems)
        quota = doc.flag(data, "quota_mode", path, problems)
        for ignored in ("detailed_metric", "value_to_metric"):
            doc.flag(data, ignored, path, problems)
        share = doc.flag(data, "share_threshold", path, problems)
        if share and "*" not in composite:
            problems.add(
                f"{path}.share_threshold",
                "share_threshold can only be used with wildcard values (containing '*'), "
                f"but found key '{composite}'",
            )
        base = DescriptorLimit(
            scope_name(domain, []),
            None,
            stats_key=stats_key,
            shadow_mode=shadow,
            quota_mode=quota,
            metadata=doc.metadata(data.get("metadata"), f"{path}.metadata", problems),
        )
        limit = self.limit_of(data, domain, here, base, path)
        children = Level()
        for index, item in enumerate(doc.items(data, "descriptors", path, problems)):
            if isinstance(item, dict):
                self.descriptor(
                    item, domain, here, stats_key, children, f"{path}.descriptors[{index}]"
                )
        share_pattern = value if share and "*" in value else None
        level.nodes[composite] = DescriptorNode(composite, share_pattern, limit, children)
        if "*" in composite:
            level.wildcards.append((_wildcard(composite), composite))

    def limit_of(
        self,
        data: dict[str, Any],
        domain: str,
        here: list[tuple[str, str | None]],
        base: DescriptorLimit,
        path: str,
    ) -> DescriptorLimit | None:
        """The descriptor's rate_limit, or shardlimit's `limits:` / `rule:` instead."""
        problems = self.problems
        forms = [name for name in ("rate_limit", "limits", "rule") if data.get(name) is not None]
        if len(forms) > 1:
            problems.add(path, "give one of rate_limit, limits or rule")
            return None
        on_failure = data.get("on_failure")
        if on_failure is not None and on_failure not in ON_FAILURE:
            problems.add(f"{path}.on_failure", "must be 'allow' or 'deny'")
            on_failure = None
        if forms == ["rate_limit"]:
            rate_limit = doc.mapping(data, "rate_limit", path, problems)
            limit = self.rate_limit(rate_limit, base, f"{path}.rate_limit")
            if limit is not None and limit.rule is not None and on_failure is not None:
                rule = limit.rule
                changed = make_rule(
                    rule.name, rule.limits, on_failure, cache_denials=rule.cache_denials
                )
                limit = replace(limit, rule=changed)
            return limit
        # shardlimit's own forms: counted under the config path's scope, and named (for
        # `replaces`) by the descriptor's own `name` / `replaces`.
        name = doc.text(data, "name", path, problems)
        base = replace(
            base, scope=scope_name(domain, here), name=name, replaces=self.names(data, name, path)
        )
        if forms == ["limits"]:
            specs = parse_limits(data["limits"], f"{path}.limits", problems)
            if specs:
                return replace(base, rule=make_rule(base.scope, specs, on_failure))
        elif forms == ["rule"]:
            if not isinstance(data["rule"], str):
                problems.add(f"{path}.rule", "must be a rule name")
            else:
                return replace(base, rule_ref=data["rule"])
        return None

    def document(self, data: Any, index: int, domains: dict[str, Level]) -> None:
        problems = self.problems
        path = f"documents[{index}]"
        if not isinstance(data, dict):
            problems.add(path, "error loading config file: must be a mapping")
            return
        before = len(problems.errors)
        doc.check_keys(data, path, problems)
        if len(problems.errors) > before:
            return
        domain = doc.text(data, "domain", path, problems)
        if domain == "":
            problems.add(f"{path}.domain", "config file cannot have empty domain")
            return
        level = domains.get(domain)
        if level is not None and not self.options.merge_domains:
            problems.add(f"{path}.domain", f"duplicate domain '{domain}' in config file")
            return
        level = domains.setdefault(domain, Level())
        for number, item in enumerate(doc.items(data, "descriptors", path, problems)):
            self.descriptor(item, domain, [], "", level, f"{domain}.descriptors[{number}]")


def parse_documents(docs: list[Any], options: ParseOptions | None = None) -> dict[str, Level]:
    """YAML documents (one per domain) -> the descriptor tree of each domain."""
    loader = _Loader(options or ParseOptions())
    domains: dict[str, Level] = {}
    for index, data in enumerate(docs):
        if data is not None:
            loader.document(data, index, domains)
    loader.problems.raise_if_any()
    return domains


def parse_text(text: str, options: ParseOptions | None = None) -> dict[str, Level]:
    """Raises ValidationError or yaml.YAMLError (also for a key given twice in a mapping)."""
    return parse_documents(list(strict_load_all(text)), options)


def match(domains: dict[str, Level], domain: str, entries: list[tuple[str, str]]) -> Match | None:
    """The limit a descriptor's entries select, as envoyproxy/ratelimit's GetLimit."""
    level = domains.get(domain)
    if level is None:
        return None
    found: DescriptorLimit | None = None
    parts: list[tuple[str, str]] = []
    for index, (key, value) in enumerate(entries):
        composite = f"{key}_{value}"
        node = level.nodes.get(composite)
        shown = value
        if node is None:
            for pattern, wildcard in level.wildcards:
                if pattern.fullmatch(composite):
                    node = level.nodes[wildcard]
                    if node.share_pattern is not None:
                        shown = node.share_pattern  # every match shares one counter
                    break
        if node is None:
            node = level.nodes.get(key)
        parts.append((key, shown))
        if node is not None and node.limit is not None and index == len(entries) - 1:
            found = node.limit
        if node is None or not node.children:
            break
        level = node.children
    return None if found is None else Match(found, limit_key(domain, parts))


class EnvoyConfigFile(WatchedFile):
    """The descriptors file, reloaded when its mtime changes; a bad file keeps the
    previous config (logged, counted in reload_errors)."""

    LOAD_ERRORS = (ValidationError, yaml.YAMLError)

    def __init__(self, path: Path | None, options: ParseOptions | None = None) -> None:
        super().__init__(path)
        self.options = options or ParseOptions()
        self.domains: dict[str, Level] = {}

    def load(self) -> None:
        """Raises ValidationError, yaml.YAMLError or OSError (a bad or unreadable file).
        Once descriptors are served, a file gone or left with no domain is refused too:
        a truncated write or a lost volume would otherwise lift every limit at once (a
        file with a domain and no descriptors lifts them on purpose)."""
        if self.path is None:
            self.domains, self._mtime = {}, None
            return
        mtime = self.path.stat().st_mtime if self.path.exists() else None
        try:
            if mtime is None:
                if self.domains:
                    raise ValidationError([FieldError("file", "is gone")])
                log.warning(
                    "no envoy descriptors file at %s: every descriptor answers OK until "
                    "one is written there",
                    self.path,
                )
                self.domains, self._mtime = {}, None
                return
            try:
                text = self.path.read_text()
            except UnicodeDecodeError as undecoded:
                raise ValidationError(
                    [FieldError("file", not_utf8(self.path, undecoded))]
                ) from None
            domains = parse_text(text, self.options)
            if self.domains and not domains:
                raise ValidationError([FieldError("file", "holds no domain")])
        except (ValidationError, yaml.YAMLError) as exc:
            self.reload_errors += 1
            self._mtime = mtime
            cause = yaml_cause(self.path, exc) if isinstance(exc, yaml.YAMLError) else str(exc)
            log.error("envoy config %s rejected, keeping the previous one: %s", self.path, cause)
            raise
        self.domains, self._mtime = domains, mtime
        self.reloads += 1
