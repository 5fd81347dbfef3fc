"""What an integration does when the router cannot answer: the client-side on_failure.

The router applies each rule's own `on_failure` whenever *it* is reachable (a node that is
down gives a `degraded` decision). When the router itself cannot be reached (connection
refused, timeout, 5xx, broken answer: `Unavailable`), the SDK cannot know the rule's
setting, so it applies the integration's `on_failure` argument, or `DEFAULT_ON_FAILURE`
("allow": fail open) when none was given, and logs a warning either way.
"""

from __future__ import annotations

import logging
from typing import Literal

from cluster.sdk.client import Decision, Unavailable

OnFailure = Literal["allow", "deny"]
DEFAULT_ON_FAILURE: OnFailure = "allow"
# A refusal for lack of an answer asks to retry in a second, as the router's degraded denials do.
UNREACHABLE_RETRY_MS = 1000
UNREACHABLE_REASON = "unreachable"

log = logging.getLogger("shardlimit.integrations")


def check_on_failure(value: str | None) -> OnFailure | None:
    """Validate an `on_failure` argument at construction time."""
    if value is None:
        return None
    if value == "allow":
        return "allow"
    if value == "deny":
        return "deny"
    raise ValueError(f"on_failure must be 'allow', 'deny' or None, not {value!r}")


def unreachable_decision(
    key: str, rule: str, on_failure: OnFailure | None, error: Unavailable
) -> Decision:
    """The decision to act on when the router did not answer: degraded, nothing consumed."""
    chosen = on_failure or DEFAULT_ON_FAILURE
    source = "on_failure override" if on_failure else "default, no on_failure given"
    log.warning(
        "shardlimit router unavailable (%s): %s key %r under rule %r (%s)",
        error,
        "allowing" if chosen == "allow" else "denying",
        key,
        rule,
        source,
    )
    allowed = chosen == "allow"
    return Decision(
        allowed=allowed,
        key=key,
        rule=rule,
        node="",
        retry_after_ms=None if allowed else UNREACHABLE_RETRY_MS,
        limits=(),
        degraded=True,
        degraded_reason=UNREACHABLE_REASON,
    )
