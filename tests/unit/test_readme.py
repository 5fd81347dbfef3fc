"""The README followed literally: its commands run as written in a shell that activated
the virtualenv once, its contents links lead somewhere, and its Python client does not
replay a decision of the session before it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {path.name: path.read_text() for path in (ROOT / "docs").glob("*.md")}


def _commands(text: str) -> list[str]:
    """Every `$ ...` line of a code block."""
    return [m.group(1) for m in re.finditer(r"^\s*\$ (.+)$", text, re.M)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_no_variable_is_left_unexpanded_in_single_quotes() -> None:
    """`curl -s '$R/v1/usage?...'` sends the text `$R`: curl exits 3."""
    quoted = [
        command
        for text in (README, *DOCS.values())
        for command in _commands(text)
        if re.search(r"'\$[A-Z_]+/", command)
    ]
    assert quoted == []


def test_commands_use_the_activated_virtualenv() -> None:
    """Activated once at the top, then bare `shardlimit` and `python` throughout."""
    assert ". .venv/bin/activate" in README.split("## A real session")[0]
    spelled_out = [c for c in _commands(README) if ".venv/bin/" in c or "-m cluster.cli" in c]
    assert spelled_out == []


def test_contents_links_lead_to_headings() -> None:
    contents = README.split("## Two commands")[0]
    targets = re.findall(r"\]\(#([^)]+)\)", contents)
    anchors = {_anchor(h) for h in re.findall(r"^#+ (.+)$", README, re.M)}
    assert len(targets) >= 10
    assert [t for t in targets if t not in anchors] == []
    for link in re.findall(r"\]\((docs/[^)#]+)", contents):
        assert (ROOT / link).exists(), link


def test_the_python_client_does_not_replay_the_session() -> None:
    """A request_id the session already used would replay its decision (and its refund
    was made): the client example's figures would not be the ones it prints."""
    session = README.split("## A real session")[1].split("## Python client")[0]
    client = README.split("## Python client")[1].split("## Algorithms")[0]
    used = set(re.findall(r'"request_id":"([^"]+)"', session))
    reused = set(re.findall(r'request_id="([^"]+)"', client)) & used
    assert "pay-1001" in used and reused == set()
