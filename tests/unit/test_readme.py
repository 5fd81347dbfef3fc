"""The README followed literally: its commands run as written in a shell that activated
the virtualenv once, its contents links lead to its headings, every relative link leads
to a file, it stays a front door (at most 400 lines), and the Python client in
docs/integrations.md does not replay a decision of the README's money recipe."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
DOCS = {path.name: path.read_text() for path in (ROOT / "docs").glob("*.md")}
MAX_README_LINES = 400


def _commands(text: str) -> list[str]:
    """Every `$ ...` line of a code block."""
    return [m.group(1) for m in re.finditer(r"^\s*\$ (.+)$", text, re.M)]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _headings(text: str) -> list[str]:
    """Markdown headings outside code blocks (a `# comment` in a shell block is none)."""
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    return re.findall(r"^#+ (.+)$", outside, re.M)


def _anchors(path: Path) -> set[str]:
    return {_anchor(h) for h in _headings(path.read_text())}


def _section(text: str, heading: str) -> str:
    """The text under `heading` (any level) up to the next heading of that level or above."""
    level = re.search(rf"^(#+) {re.escape(heading)}$", text, re.M)
    assert level is not None, heading
    rest = text[level.end() :]
    end = re.search(rf"^#{{1,{len(level.group(1))}}} ", rest, re.M)
    return rest if end is None else rest[: end.start()]


def _contents() -> str:
    return README.split("## Two commands")[0]


def test_readme_is_a_front_door() -> None:
    assert len(README.splitlines()) <= MAX_README_LINES


def test_no_variable_is_left_unexpanded_in_single_quotes() -> None:
    """`curl -s '$R/v1/usage?...'` sends the text `$R`: curl exits 3."""
    quoted = [
        command
        for text in (README, *DOCS.values())
        for command in _commands(text)
        if re.search(r"'\$[A-Z_0-9]+/", command)
    ]
    assert quoted == []


def test_commands_use_the_activated_virtualenv() -> None:
    """Activated once at the top, then bare `shardlimit` and `python` throughout, in the
    README and in docs/ alike."""
    assert ". .venv/bin/activate" in README.split("## Recipes")[0]
    spelled_out = [
        command
        for text in (README, *DOCS.values())
        for command in _commands(text)
        if ".venv/bin/" in command or "-m cluster.cli" in command
    ]
    assert spelled_out == []


def test_every_contents_entry_is_a_heading() -> None:
    targets = re.findall(r"\]\(#([^)]+)\)", _contents())
    anchors = _anchors(ROOT / "README.md")
    assert len(targets) >= 10
    assert [t for t in targets if t not in anchors] == []


def test_every_recipe_is_in_the_contents() -> None:
    recipes = re.findall(r"^### (.+)$", _section(README, "Recipes"), re.M)
    targets = set(re.findall(r"\]\(#([^)]+)\)", _contents()))
    assert len(recipes) >= 7
    assert [r for r in recipes if _anchor(r) not in targets] == []


def test_relative_links_lead_to_files() -> None:
    """README links such as `docs/guarantees.md` or `configs/rules.yaml`, and the links
    between docs/ pages, name files the repository has (and anchors they have)."""
    missing = []
    pages = {ROOT / "README.md": README, **{ROOT / "docs" / n: t for n, t in DOCS.items()}}
    for page, text in pages.items():
        for link in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", link) or link.startswith("#"):
                continue
            target, _, anchor = link.partition("#")
            path = (page.parent / target).resolve()
            if not path.exists():
                missing.append(f"{page.name}: {link}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                missing.append(f"{page.name}: {link} (no such heading)")
    assert missing == []


def test_the_links_list_names_the_guides() -> None:
    more = _section(README, "More")
    for guide in ("guarantees", "leases", "resharding", "replicas", "envoy", "integrations"):
        assert f"(docs/{guide}.md)" in more, guide
    assert "[docs/leases.md](docs/leases.md)" in more.split("Leases and locks")[1].split("\n")[0]


def test_the_guarantees_table_links_to_the_full_text() -> None:
    guarantees = _section(README, "Guarantees")
    assert "| situation |" in guarantees
    assert "(docs/guarantees.md)" in guarantees


def test_the_python_client_does_not_replay_the_recipes() -> None:
    """A request_id the money recipe already used would replay its decision (and its
    refund was made): the client example's figures would not be the ones it prints."""
    session = _section(README, "A daily money quota per merchant")
    client = _section(DOCS["integrations.md"], "Python client")
    used = set(re.findall(r'"request_id":"([^"]+)"', session))
    reused = set(re.findall(r'request_id="([^"]+)"', client)) & used
    assert "pay-1001" in used and reused == set()


def test_the_leaky_bucket_example_shows_a_delay() -> None:
    """The prose says a leaky bucket admits with a delay: its example must show one."""
    answers = [
        json.loads(line)
        for line in _section(DOCS["algorithms.md"], "A tour of the API").splitlines()
        if line.startswith('{"allowed"') and '"leaky_bucket"' in line
    ]
    delays = [a["limits"][0]["delay_ms"] for a in answers if a["allowed"]]
    assert len(delays) >= 2 and delays[0] == 0 and all(d > 0 for d in delays[1:])
    assert any(not a["allowed"] for a in answers)  # and a denial once the queue is full


def test_no_command_names_a_lease_id_the_server_drew() -> None:
    """A lease id holds a random part: a command that spells one out can never match;
    the recipes carry the id they were given in a variable."""
    spelled = [
        command
        for text in (README, *DOCS.values())
        for command in _commands(text)
        if re.search(r'"lease_id":"\d+\.[0-9a-f]+"', command)
    ]
    assert spelled == []


def test_a_restart_with_arguments_keeps_the_admin_token() -> None:
    """The recipes' shell exports `s3cret`: a `make run` started without it prints a new
    token, and every admin step after it is refused."""
    restarts = [
        line
        for text in (README, *DOCS.values())
        for line in text.splitlines()
        for found in re.finditer(r"(\S*)\s*make run ARGS=", line)
        if found.group(1) != "`SHARDLIMIT_ADMIN_TOKEN=s3cret"
    ]
    assert restarts == []
