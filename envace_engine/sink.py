"""The ``Sink`` protocol: where the engine hands its output (episodes, step metrics, progress).

The engine never imports storage: jobs pass it a sink. ``storage.shards.RunWriter`` implements
this with append-only Parquet shards; ``JsonlSink`` (engine side, no dependencies) writes JSON
Lines for quick command-line runs and tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

from envace_engine.types import Episode


@runtime_checkable
class Sink(Protocol):
    """Receives a job's output as it is produced. ``step`` is the training/eval step index."""

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Store one step's episodes (called once per step, after rewards are set)."""
        ...

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Store one step's scalar metrics (flat names such as ``reward/act``)."""
        ...

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Report progress (``done`` of ``total`` units) for live display."""
        ...
