"""Log set-up of every command: human lines, or with `--json` one JSON object a line."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """{"ts", "level", "logger", "message", ...extra fields, "exc" when there is one}."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name, value in vars(record).items():
            if name not in _STANDARD and name not in line:
                line[name] = value
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure(as_json: bool) -> None:
    """Root logging to stderr at SHARDLIMIT_LOG_LEVEL (default INFO); like
    `logging.basicConfig`, nothing changes if the root logger has handlers already."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else logging.Formatter(HUMAN_FORMAT))
    logging.basicConfig(level=os.environ.get("SHARDLIMIT_LOG_LEVEL", "INFO"), handlers=[handler])
