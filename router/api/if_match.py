"""If-Match on rules writes: the rules version a client read, as an ETag."""

from __future__ import annotations

import re
from collections.abc import Mapping

from cluster.model.errors import FieldError
from cluster.web.problem import Problem

IF_MATCH = re.compile(r'(?:W/)?(?:"[0-9]{1,18}"|[0-9]{1,18})')  # "3", W/"3" or 3


def if_match(headers: Mapping[str, str]) -> int | None:
    """The rules version an If-Match header names (None: no header). Raises Problem."""
    raw = headers.get("If-Match")
    if raw is None:
        return None
    value = raw.strip()
    if not IF_MATCH.fullmatch(value):  # not isdigit(): "²" is a digit, int() refuses it
        raise Problem(
            400,
            "validation",
            'If-Match must be a rules version as an ETag, e.g. "3"',
            [FieldError("If-Match", "not a rules version")],
        )
    return int(value.removeprefix("W/").strip('"'))
