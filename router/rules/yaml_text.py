"""The YAML the router reads from files (rules files and Envoy descriptors): UTF-8 text,
and PyYAML's safe loader made strict, refusing a key given twice in one mapping where
PyYAML would keep the last."""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

import yaml

_MERGE = "tag:yaml.org,2002:merge"


class NotAName(yaml.MarkedYAMLError):
    """Valid YAML, but a key that must be a name is read as another type: quote it."""


def not_utf8(path: Path, exc: UnicodeDecodeError) -> str:
    """A file that cannot be decoded, in one line."""
    return f"{path}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x} at offset {exc.start})"


class StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (the YAML spec
    requires unique keys; PyYAML keeps the last). Keys a merge (`<<:`) brings in may be
    overridden, as YAML says."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, yaml.Node] = {}
            for key_node, _value in node.value:
                if key_node.tag == _MERGE:
                    continue
                key = self.construct_object(key_node, deep=True)
                if not isinstance(key, Hashable):
                    continue  # refused as unhashable below
                first = seen.setdefault(key, key_node)
                if first is not key_node:
                    at = first.start_mark
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key_node.value!r} (first at line {at.line + 1}, "
                        f"column {at.column + 1})",
                        key_node.start_mark,
                    )
        return super().construct_mapping(node, deep=deep)


class ExactLoader(StrictLoader):
    """StrictLoader reading a float as written, an exact Decimal: a rule's `max_amount:
    100.000000000000001` is refused for its decimals, not read as 100.0."""


def _exact_float(loader: yaml.SafeLoader, node: yaml.Node) -> Any:
    assert isinstance(node, yaml.ScalarNode)
    try:
        number = Decimal(str(loader.construct_scalar(node)).replace("_", ""))
    except InvalidOperation:  # .inf, .nan, 1:30.5 (base 60): as PyYAML reads them
        return loader.construct_yaml_float(node)
    return number if number.is_finite() else loader.construct_yaml_float(node)


ExactLoader.add_constructor("tag:yaml.org,2002:float", _exact_float)


def strict_load_all(text: str) -> Iterator[Any]:
    """Every YAML document of `text`. Raises yaml.YAMLError, also for a key given twice."""
    return yaml.load_all(text, Loader=StrictLoader)
