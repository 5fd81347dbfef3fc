"""A configuration file the router re-reads when its modification time changes."""

from __future__ import annotations

import contextlib
from pathlib import Path


class WatchedFile:
    """Subclasses implement `load()` (it sets `_mtime`, counts `reloads`, and on a bad
    file counts `reload_errors`, keeps what was loaded before and raises one of
    `LOAD_ERRORS`)."""

    LOAD_ERRORS: tuple[type[Exception], ...] = ()

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._mtime: float | None = None
        self.reloads = 0
        self.reload_errors = 0

    def load(self) -> None:
        raise NotImplementedError

    def reload_if_changed(self) -> bool:
        """Load again if the file changed since the last load (a bad file is logged by
        `load` and swallowed here); whether it had changed."""
        if self.path is None:
            return False
        mtime = self.path.stat().st_mtime if self.path.exists() else None
        if mtime == self._mtime:
            return False
        with contextlib.suppress(*self.LOAD_ERRORS):
            self.load()
        return True
