"""Shared value types of the cluster model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One counter node as the topology knows it."""

    id: str
    url: str
    weight: int = 1

    def to_dict(self) -> dict[str, object]:
        return {"id": self.id, "url": self.url, "weight": self.weight}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> NodeSpec:
        weight = data.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise ValueError(f"node weight must be a positive integer, got {weight!r}")
        return cls(id=str(data["id"]), url=str(data["url"]), weight=weight)
