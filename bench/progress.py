"""Progress lines on stderr (stdout carries only the JSON document)."""

from __future__ import annotations

import sys
import time

_STARTED = time.monotonic()


def note(message: str) -> None:
    elapsed = int(time.monotonic() - _STARTED)
    print(f"[bench {elapsed // 60:02d}:{elapsed % 60:02d}] {message}", file=sys.stderr, flush=True)
