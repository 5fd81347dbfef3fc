"""Validation errors carrying field paths, shared by router and node."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class FieldError:
    path: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"field": self.path, "message": self.message}


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """ "; did you mean 'a' or 'b'?" naming the known names nearest `name` (difflib), or
    "" when none is near."""
    close = [f"'{c}'" for c in difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)]
    if not close:
        return ""
    listed = close[0] if len(close) == 1 else f"{', '.join(close[:-1])} or {close[-1]}"
    return f"; did you mean {listed}?"


class ValidationError(ValueError):
    """One or more problems with an input document."""

    def __init__(self, errors: list[FieldError]) -> None:
        self.errors = errors
        super().__init__("; ".join(f"{e.path}: {e.message}" for e in errors))


class Problems:
    """Collects field errors during a one-pass parse."""

    __slots__ = ("errors",)

    def __init__(self) -> None:
        self.errors: list[FieldError] = []

    def add(self, path: str, message: str) -> None:
        self.errors.append(FieldError(path, message))

    def raise_if_any(self) -> None:
        if self.errors:
            raise ValidationError(self.errors)

    def result(self, value: _T | None) -> _T:
        """What a one-pass parse returned; raises ValidationError with every problem it
        found instead (a parse returns None only when it found some)."""
        self.raise_if_any()
        if value is None:
            raise ValidationError([FieldError("body", "is not valid")])
        return value
