"""The last rejected edit of a router's rules file: why it was refused (a YAML error as
`file:line:column: problem`), when, and which cluster rules version is served instead.
Shown in `GET /v1/rules` (its `file` block), and from there by `shardlimit status`, the
`up` console and `/ui`, until an edit of the file is accepted."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from router.rules.yaml_text import NotAName


@dataclass(frozen=True)
class Rejection:
    at: float  # Unix time of the refusal
    cause: str  # one line: the file, and why it was refused

    def to_dict(self, serving_version: int) -> dict[str, Any]:
        when = datetime.fromtimestamp(self.at, UTC).isoformat(timespec="seconds")
        return {
            "at": when.replace("+00:00", "Z"),
            "cause": self.cause,
            "serving_version": serving_version,
        }


def rejected_now(cause: str) -> Rejection:
    return Rejection(time.time(), cause)


def yaml_cause(path: Path, exc: yaml.YAMLError) -> str:
    """`path:line:column: problem` (1-based, where the parser stopped), one line."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None)
    if mark is None or not problem:
        return f"{path}: not YAML: {' '.join(str(exc).split())}"
    context = getattr(exc, "context", None)
    said = f"{problem} ({context})" if context else str(problem)
    kind = "" if isinstance(exc, NotAName) else "not YAML: "
    return f"{path}:{mark.line + 1}:{mark.column + 1}: {kind}{' '.join(said.split())}"


def file_block(path: Path | None, rejection: Rejection | None, version: int) -> dict[str, Any]:
    """`GET /v1/rules`'s `file`: the rules file this router watches (null: none) and its
    last rejected edit (null: the file's last edit was not refused)."""
    return {
        "path": None if path is None else str(path),
        "rejected": None if rejection is None else rejection.to_dict(version),
    }


# `file` in the OpenAPI document's RuleList (what `file_block` answers).
FILE_BLOCK_SCHEMA: dict[str, Any] = {
    "type": "object",
    "description": "GET only: the rules file this router watches, and its last edit that "
    "was refused (null once an edit is accepted)",
    "required": ["path", "rejected"],
    "properties": {
        "path": {"type": ["string", "null"]},
        "rejected": {
            "type": ["object", "null"],
            "required": ["at", "cause", "serving_version"],
            "properties": {
                "at": {"type": "string", "format": "date-time"},
                "cause": {"type": "string", "description": "one line; YAML: file:line:column"},
                "serving_version": {"type": "integer", "description": "served instead"},
            },
        },
    },
}
