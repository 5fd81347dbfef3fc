"""compose/docker-compose.yml is valid Compose (no Docker engine on the build machines)."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import yaml

from router.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_CANDIDATES = [
    ROOT / "compose" / "compose-spec.json",
    ROOT.parent / "shared" / "schemas" / "compose-spec.json",
]


def test_compose_file_matches_the_compose_spec() -> None:
    schema_path = next(p for p in SCHEMA_CANDIDATES if p.exists())
    schema = json.loads(schema_path.read_text())
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    jsonschema.Draft7Validator(schema).validate(doc)
    assert {"router", "node1", "node2", "node3", "redis1", "redis2", "redis3"} == set(
        doc["services"]
    )


def test_compose_router_config_is_valid() -> None:
    config = load_config(ROOT / "compose" / "cluster.yaml")
    assert [n.url for n in config.nodes] == [f"http://node{i}:700{i}" for i in (1, 2, 3)]
