"""Shared value types of the cluster model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One counter node (a shard) as the topology knows it.

    A shard may be served by several node processes on different hosts, its endpoints,
    all of them on the shard's one Redis (its primary, found through Sentinel). `url` is
    the first endpoint; `more_urls` the others. Any live endpoint may serve any key of
    the shard: each check is one atomic script on the shard's primary.
    """

    id: str
    url: str
    weight: int = 1
    more_urls: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every endpoint of the shard, the first one first."""
        return (self.url, *self.more_urls)

    def to_dict(self) -> dict[str, object]:
        if self.more_urls:
            return {"id": self.id, "urls": list(self.urls), "weight": self.weight}
        return {"id": self.id, "url": self.url, "weight": self.weight}

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> NodeSpec:
        """`{"id", "url", "weight"}` or `{"id", "urls": [...], "weight"}`."""
        weight = data.get("weight", 1)
        if not isinstance(weight, int) or isinstance(weight, bool) or weight < 1:
            raise ValueError(f"node weight must be a positive integer, got {weight!r}")
        urls = data.get("urls")
        if urls is None:
            if "url" not in data:
                raise ValueError("a node needs a url (or urls)")
            urls = [data["url"]]
        if (
            not isinstance(urls, list)
            or not urls
            or not all(isinstance(url, str) and url for url in urls)
        ):
            raise ValueError(f"node urls must be a non-empty list of URLs, got {urls!r}")
        if len(set(urls)) != len(urls):
            raise ValueError(f"node {data.get('id')} lists an endpoint twice")
        if "url" in data and "urls" in data and data["url"] != urls[0]:
            raise ValueError("a node's url, when given with urls, must be its first")
        return cls(id=str(data["id"]), url=str(urls[0]), weight=weight, more_urls=tuple(urls[1:]))
