"""The SDK's import paths of the previous release (`cluster.client`, `cluster.decorator`,
`cluster.asgi`, `cluster.aiohttp_middleware`) keep working for one more release, with a
DeprecationWarning naming the new path. They alias the module itself, so
`isinstance` and `except` see the same classes under both names."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Sequence
from types import ModuleType

MOVED: dict[str, str] = {
    "cluster.client": "cluster.sdk.client",
    "cluster.decorator": "cluster.sdk.decorator",
    "cluster.asgi": "cluster.sdk.asgi",
    "cluster.aiohttp_middleware": "cluster.sdk.aiohttp_middleware",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} is deprecated and goes in the next release; import {self.new} "
            "(or simply cluster.sdk) instead",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """The module is the new one, already executed."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(fullname)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _Alias(new))


def install() -> None:
    if not any(isinstance(finder, _MovedFinder) for finder in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
