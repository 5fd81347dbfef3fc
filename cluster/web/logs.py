"""Log set-up of every command: human lines, or with `--json` one JSON object a line."""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import sys
import time
from collections.abc import Callable

from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web import RequestPayloadError

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}
HUMAN_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
REPEAT_WINDOW_ENV = "SHARDLIMIT_LOG_REPEAT_S"
REPEAT_WINDOW_S = 10.0
_REMEMBERED = 1000  # distinct repeated messages kept track of at most


class RepeatFilter(logging.Filter):
    """Warnings and errors repeated word for word (a Redis that stays down, retried 4
    times a second) pass once per `window_s`; the next one after the window says how
    many were held back (`repeated` in JSON logs). Other records always pass."""

    def __init__(
        self, window_s: float = REPEAT_WINDOW_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self.seen: dict[tuple[str, int, str], tuple[float, int]] = {}  # -> (passed at, held)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or self.window_s <= 0:
            return True
        message = record.getMessage()
        key = (record.name, record.levelno, message)
        now = self.clock()
        passed_at, held = self.seen.get(key, (None, 0))
        if passed_at is not None and now - passed_at < self.window_s:
            self.seen[key] = (passed_at, held + 1)
            return False
        if passed_at is not None and held:
            record.msg = f"{message} (repeated {held} more times in {now - passed_at:.0f} s)"
            record.args = None
            record.repeated = held
        self.seen[key] = (now, 0)
        if len(self.seen) > _REMEMBERED:
            self.seen = {k: v for k, v in self.seen.items() if now - v[0] < self.window_s}
        return True


class MalformedRequestFilter(logging.Filter):
    """aiohttp logs each request it cannot parse (a NUL in a header, a bad chunk size, a
    body its Content-Encoding does not decode) as an error with a traceback, though it is
    answered with a 4xx and nothing failed here.
    Such a record becomes one DEBUG line, as aiohttp does already for a request that is
    not HTTP at all (and as nginx and Envoy log malformed requests): the mistake is the
    client's, and a client sending them must not fill the service's log."""

    def __init__(self, logger: logging.Logger) -> None:
        super().__init__()
        self.logger = logger

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RequestPayloadError):  # a body it could not read, as the cause
            exc = exc.__cause__
        if not (isinstance(exc, HttpProcessingError) and 400 <= exc.code < 500):
            return True
        reason = str(exc.message).strip().splitlines()[0] if exc.message else ""
        record.msg = f"{record.getMessage()}: {exc.code} {reason}".rstrip()
        record.args = None
        record.exc_info = None
        record.exc_text = None
        record.levelno = logging.DEBUG
        record.levelname = logging.getLevelName(logging.DEBUG)
        return self.logger.isEnabledFor(logging.DEBUG)


def quiet_malformed_requests() -> None:
    """Install `MalformedRequestFilter` on aiohttp's server logger (once)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedRequestFilter) for f in logger.filters):
        logger.addFilter(MalformedRequestFilter(logger))


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
    try:
        window = float(os.environ.get(REPEAT_WINDOW_ENV, REPEAT_WINDOW_S))
    except ValueError:
        window = REPEAT_WINDOW_S
    handler.addFilter(RepeatFilter(window))
    quiet_malformed_requests()
    logging.basicConfig(level=os.environ.get("SHARDLIMIT_LOG_LEVEL", "INFO"), handlers=[handler])
