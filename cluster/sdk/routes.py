"""Which rule limits a request: per-route rules, a default rule and exempt routes.

Routes are named by exact path (`/login`), by a pattern with `{param}` segments
(`/items/{item_id}`, `{rest:path}` matches across slashes) or, where the framework
knows it, by route name or route pattern (aiohttp's `name=` and resource pattern).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

_PARAM = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)(?::([A-Za-z]+))?\}")


def _pattern(route: str) -> re.Pattern[str] | None:
    if "{" not in route:
        return None
    parts: list[str] = []
    last = 0
    for match in _PARAM.finditer(route):
        parts.append(re.escape(route[last : match.start()]))
        parts.append(".*" if match.group(2) == "path" else "[^/]+")
        last = match.end()
    parts.append(re.escape(route[last:]))
    return re.compile("".join(parts))


@dataclass(frozen=True, slots=True)
class _Route:
    name: str
    pattern: re.Pattern[str] | None

    def matches(self, path: str, names: Sequence[str]) -> bool:
        if self.name == path or self.name in names:
            return True
        return self.pattern is not None and self.pattern.fullmatch(path) is not None


class RouteRules:
    """Resolves a request to a rule name, or None when it is not limited."""

    def __init__(
        self,
        rules: Mapping[str, str] | None = None,
        default_rule: str | None = None,
        exempt: Iterable[str] = (),
    ) -> None:
        self._rules = [
            (_Route(route, _pattern(route)), rule) for route, rule in (rules or {}).items()
        ]
        self._exempt = [_Route(route, _pattern(route)) for route in exempt]
        self.default_rule = default_rule

    def rule_for(self, path: str, names: Sequence[str] = ()) -> str | None:
        """Exempt first, then exact paths and names, then patterns, then the default."""
        if any(route.matches(path, names) for route in self._exempt):
            return None
        for route, rule in self._rules:
            if route.name == path or route.name in names:
                return rule
        for route, rule in self._rules:
            if route.matches(path, names):
                return rule
        return self.default_rule
