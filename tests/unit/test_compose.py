"""compose/docker-compose.yml is valid Compose (no Docker engine on the build machines)."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

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
    shards = [f"redis{i}" for i in (1, 2, 3)]
    assert {
        "router",
        *(f"node{i}{endpoint}" for i in (1, 2, 3) for endpoint in ("", "-b")),
        *shards,
        *(f"{shard}-replica" for shard in shards),
        *(f"sentinel-{i}" for i in (1, 2, 3)),
    } == set(doc["services"])


def test_compose_router_config_is_valid() -> None:
    config = load_config(ROOT / "compose" / "cluster.yaml")
    # Two endpoints per shard: nodeN and nodeN-b, the same node process on its own container.
    assert [n.urls for n in config.nodes] == [
        (f"http://node{i}:700{i}", f"http://node{i}-b:700{i}") for i in (1, 2, 3)
    ]


# -- the image's file ownership, from the Dockerfile (no Docker engine here) -------------


@dataclass
class ImageLayout:
    """The directories an image holds and who owns each, as the Dockerfile's instructions
    leave them. It understands the instructions compose/Dockerfile uses and refuses any
    other, so a test cannot pass by not understanding a line."""

    owners: dict[str, str] = field(
        default_factory=lambda: dict.fromkeys(("/", "/home", "/usr", "/var"), "root")
    )
    users: set[str] = field(default_factory=lambda: {"root"})
    user: str = "root"
    workdir: str = "/"

    def owner(self, path: str) -> str | None:
        return self.owners.get(path.rstrip("/") or "/")

    def _make(self, path: str, owner: str, parents: bool) -> None:
        parent = str(PurePosixPath(path).parent)
        if parent not in self.owners:
            assert parents, f"mkdir {path}: no {parent}"
            self._make(parent, owner, parents)
        self.owners.setdefault(path, owner)

    def _absolute(self, path: str) -> str:
        return str(PurePosixPath(self.workdir) / path)

    def run(self, command: list[str]) -> None:
        name, *args = command
        if name == "pip":
            return
        if name == "useradd":
            user = args[-1]
            self.users.add(user)
            if "--create-home" in args or "-m" in args:
                self._make(f"/home/{user}", user, parents=False)
            return
        if name == "mkdir":
            for path in (a for a in args if not a.startswith("-")):
                self._make(self._absolute(path), self.user, parents="-p" in args)
            return
        if name == "chown":
            assert self.user == "root", "only root changes owners"
            owner, *paths = [a for a in args if not a.startswith("-")]
            user = owner.split(":")[0]
            assert user in self.users, f"chown to unknown user {user}"
            for path in paths:
                assert self._absolute(path) in self.owners, f"chown {path}: no such directory"
                self.owners[self._absolute(path)] = user
            return
        raise AssertionError(f"RUN {name}: not understood by this reader")

    @classmethod
    def of(cls, dockerfile: str) -> ImageLayout:
        layout = cls()
        text = re.sub(r"\\\n", " ", dockerfile)
        for line in text.splitlines():
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            instruction, _, rest = line.partition(" ")
            if instruction == "WORKDIR":
                layout.workdir = layout._absolute(rest.strip())
                layout._make(layout.workdir, layout.user, parents=True)
            elif instruction == "COPY":
                *_, target = shlex.split(rest)
                if target.endswith("/") or target in (".", "./"):
                    continue  # files into an existing directory
                layout._make(layout._absolute(target), "root", parents=True)  # no --chown
            elif instruction == "RUN":
                for command in rest.split("&&"):
                    layout.run(shlex.split(command))
            elif instruction == "USER":
                assert rest.strip() in layout.users, f"USER {rest}: no such user"
                layout.user = rest.strip()
            elif instruction not in ("FROM", "ENTRYPOINT", "CMD"):
                raise AssertionError(f"{instruction}: not understood by this reader")
        return layout


def _router_service() -> dict[str, Any]:
    doc = yaml.safe_load((ROOT / "compose" / "docker-compose.yml").read_text())
    service: dict[str, Any] = doc["services"]["router"]
    return service


def test_the_image_gives_the_router_data_volume_to_its_user() -> None:
    """Docker copies the ownership of the image's directory into a new named volume: the
    router's data dir must sit in a volume whose mount point the image's user owns."""
    layout = ImageLayout.of((ROOT / "compose" / "Dockerfile").read_text())
    assert layout.user == "shardlimit"
    named = {}
    for volume in _router_service()["volumes"]:
        source, target, *_ = volume.split(":")
        if not source.startswith((".", "/")):
            named[target] = source
    assert named == {"/data": "router-data"}
    assert layout.owner("/data") == "shardlimit"
    data_dir = load_config(ROOT / "compose" / "cluster.yaml").data_dir
    assert data_dir == Path("/data/router")
    assert layout.owner(str(data_dir.parent)) == layout.user  # it can create data_dir


def test_the_reader_sees_a_volume_the_image_does_not_have() -> None:
    """The previous Dockerfile: no /data in the image (a root-owned volume at run time)."""
    before = (
        "FROM python:3.11-slim\nWORKDIR /app\nCOPY cluster ./cluster\n"
        "RUN pip install --no-cache-dir . && useradd --create-home shardlimit\n"
        'USER shardlimit\nENTRYPOINT ["shardlimit"]\n'
    )
    layout = ImageLayout.of(before)
    owners = [layout.owner(path) for path in ("/data", "/app", "/home/shardlimit")]
    assert owners == [None, "root", "shardlimit"]


def test_configuration_is_mounted_read_only() -> None:
    """The router never rewrites its configuration: both files are mounted read-only."""
    binds = {}
    for volume in _router_service()["volumes"]:
        source, target, *options = volume.split(":")
        if source.startswith((".", "/")):
            binds[target] = options
    assert binds == {"/config/cluster.yaml": ["ro"], "/config/rules.yaml": ["ro"]}
    assert load_config(ROOT / "compose" / "cluster.yaml").rules_file == Path("/config/rules.yaml")
