"""Counters and histograms for the hot path of an asyncio service, exposed through
prometheus-client.

prometheus-client's own Counter.inc and Histogram.observe take a lock on every update
(about 2 and 4 µs here); a router or node updates its series only from its event loop
thread, so a child here is a plain number (a histogram: a list of bucket counts), and
prometheus-client reads them when scraped (`Families` is a registered collector).
Children are created once per label values and cached.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

__all__ = ["CounterChild", "Families", "Family", "HistogramChild"]


class CounterChild:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class HistogramChild:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        # Buckets are inclusive upper bounds (`le`): the first bound >= value.
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


C = TypeVar("C", CounterChild, HistogramChild)


class Family(Generic[C]):
    """One metric name and its children, one per label values."""

    def __init__(
        self, name: str, help_text: str, labels: Sequence[str], new_child: Callable[[], C]
    ) -> None:
        self.name = name
        self.help = help_text
        self.labels = tuple(labels)
        self._new_child: Callable[[], C] = new_child
        self.children: dict[tuple[str, ...], C] = {}

    def __call__(self, *values: str) -> C:
        """The child for `values` (one per label, in order; none for an unlabelled one)."""
        child = self.children.get(values)
        if child is None:
            if len(values) != len(self.labels):
                raise ValueError(f"{self.name} takes labels {self.labels}, not {values}")
            child = self.children[values] = self._new_child()
        return child


class Families(Collector):
    """The hot-path series of one app, registered in its registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counters: list[Family[CounterChild]] = []
        self._histograms: list[tuple[Family[HistogramChild], tuple[str, ...]]] = []
        registry.register(self)

    def counter(self, name: str, help_text: str, *labels: str) -> Family[CounterChild]:
        """`name` ends in `_total`."""
        family = Family(name.removesuffix("_total"), help_text, labels, CounterChild)
        self._counters.append(family)
        if not labels:
            family()  # an unlabelled counter shows 0 before its first increment
        return family

    def histogram(
        self, name: str, help_text: str, buckets: Sequence[float], *labels: str
    ) -> Family[HistogramChild]:
        bounds = tuple(sorted(float(b) for b in buckets))
        family = Family(name, help_text, labels, lambda: HistogramChild(bounds))
        labels_le = tuple(floatToGoString(b) for b in bounds)  # type: ignore[no-untyped-call]
        self._histograms.append((family, labels_le))
        if not labels:
            family()
        return family

    def collect(self) -> Iterator[Metric]:
        for counters in self._counters:
            out = CounterMetricFamily(counters.name, counters.help, labels=counters.labels)
            for values, counter in counters.children.items():
                out.add_metric(values, counter.value)
            yield out
        for histograms, bounds in self._histograms:
            hist = HistogramMetricFamily(histograms.name, histograms.help, labels=histograms.labels)
            for values, child in histograms.children.items():
                running, buckets = 0, []
                for bound, count in zip((*bounds, "+Inf"), child.counts, strict=True):
                    running += count
                    buckets.append((bound, float(running)))
                hist.add_metric(values, buckets, child.sum)
            yield hist
