"""The rules file's last refused edit, as a router's `GET /v1/rules` shows it (its `file`
block), in one line for a person: `shardlimit status` prints it, and `shardlimit up`
watches its first router for it (`RulesFileWatch`) and says so on its console."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

ACCEPTED = "rules file accepted again"


def rejection_line(block: Any) -> str | None:
    """None when the file's last edit was not refused."""
    rejected = block.get("rejected") if isinstance(block, dict) else None
    if not isinstance(rejected, dict):
        return None
    return (
        f"rules file rejected at {rejected.get('at')}: {rejected.get('cause')}; "
        f"still serving rules version {rejected.get('serving_version')}"
    )


def rules_file_block(router: str, timeout_s: float = 1.0) -> Any:
    """The router's `file` block (None when it cannot tell now)."""
    try:
        with urllib.request.urlopen(  # noqa: S310 - our own router
            f"{router}/v1/rules", timeout=timeout_s
        ) as answer:
            return json.loads(answer.read()).get("file")
    except (OSError, ValueError, AttributeError):
        return None


class RulesFileWatch:
    """Polled from `up`'s main loop: `say` once per new refusal of the rules file (its
    time and cause differ from the last said), and once when an edit is accepted again."""

    def __init__(self, router: str, say: Callable[[str], None], every_s: float = 1.0) -> None:
        self.router = router
        self.say = say
        self.every_s = every_s
        self._next = 0.0
        self._said: tuple[Any, Any] | None = None

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        block = rules_file_block(self.router, timeout_s=min(1.0, self.every_s))
        if not isinstance(block, dict):
            return
        rejected = block.get("rejected")
        if isinstance(rejected, dict):
            seen = (rejected.get("at"), rejected.get("cause"))
            if seen != self._said:
                self._said = seen
                self.say(rejection_line(block) or "")
        elif self._said is not None:
            self._said = None
            self.say(f"{ACCEPTED}: {block.get('path')}")
