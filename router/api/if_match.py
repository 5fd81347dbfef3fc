"""If-Match and If-None-Match on rules writes: the rules version a client read, as an
ETag (RFC 9110, 13.1.1 and 13.1.2)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from cluster.model.errors import FieldError
from cluster.web.problem import Problem

_ETAG = r'(?:W/)?(?:"[0-9]{1,18}"|[0-9]{1,18})'  # "3", W/"3" or 3
# `*`, or a list of rules versions as ETags: "3", "4"
IF_MATCH = re.compile(rf"\*|{_ETAG}(?:[ \t]*,[ \t]*{_ETAG})*")


@dataclass(frozen=True)
class Condition:
    """One precondition header: `*` (any), or the versions it lists."""

    any: bool
    versions: frozenset[int]


@dataclass(frozen=True)
class Preconditions:
    """A rules write's If-Match and If-None-Match. Version lists are weighed against the
    cluster's rules version (a mismatch is a version conflict); `*` against whether the
    rule written exists."""

    match: Condition | None = None
    none_match: Condition | None = None

    def version_holds(self, current: int) -> bool:
        """Whether the version conditions hold with the cluster's rules at `current`."""
        if self.match is not None and not self.match.any and current not in self.match.versions:
            return False
        return not (self.none_match is not None and current in self.none_match.versions)

    def existence_fails(self, exists: bool) -> str | None:
        """Why the `*` conditions fail for a rule that `exists` (or not): None if they hold."""
        if self.match is not None and self.match.any and not exists:
            return "If-Match: * writes only a rule that exists"
        if self.none_match is not None and self.none_match.any and exists:
            return "If-None-Match: * writes only a new rule"
        return None


def preconditions(headers: Mapping[str, str]) -> Preconditions:
    """The If-Match and If-None-Match of a write. Raises Problem (400) for a value that
    is neither `*` nor a list of rules versions."""
    return Preconditions(_condition(headers, "If-Match"), _condition(headers, "If-None-Match"))


def _condition(headers: Mapping[str, str], name: str) -> Condition | None:
    raw = headers.get(name)
    if raw is None:
        return None
    value = raw.strip()
    if not IF_MATCH.fullmatch(value):  # not isdigit(): "²" is a digit, int() refuses it
        raise Problem(
            400,
            "validation",
            f'{name} must be * or rules versions as ETags, e.g. "3"',
            [FieldError(name, "not a rules version")],
        )
    if value == "*":
        return Condition(True, frozenset())
    tags = (tag.strip().removeprefix("W/").strip('"') for tag in value.split(","))
    return Condition(False, frozenset(int(tag) for tag in tags))
