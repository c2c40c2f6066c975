"""The ``Sink`` protocol: where the engine hands its output (episodes, step metrics, progress).

The engine never imports storage: jobs pass it a sink. ``storage.shards.RunWriter`` implements
this with append-only Parquet shards; ``JsonlSink`` (engine side, no dependencies) writes JSON
Lines for quick command-line runs and tests: ``episodes.jsonl`` gets one episode per line
(``dataclasses.asdict`` with the step added), ``metrics.jsonl`` one ``{"step": …, name: value}``
object per step. Every write is appended and flushed, so a killed job leaves only complete lines.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

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


@dataclass(frozen=True)
class FanoutSink:
    """A ``Sink`` that hands everything to each of ``sinks`` in turn (none: a no-op)."""

    sinks: tuple[Sink, ...] = ()

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Forward to every sink."""
        for sink in self.sinks:
            sink.episodes(step, episodes)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Forward to every sink."""
        for sink in self.sinks:
            sink.metrics(step, metrics)

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Forward to every sink."""
        for sink in self.sinks:
            sink.progress(done, total, message)


EPISODES_FILE = "episodes.jsonl"
METRICS_FILE = "metrics.jsonl"


def episode_record(step: int, episode: Episode) -> dict[str, Any]:
    """An episode as a JSON-ready dict (enums become their string values)."""
    return {"step": step, **dataclasses.asdict(episode)}


class JsonlSink:
    """Append-only JSON Lines output under ``out_dir`` (implements ``Sink``)."""

    def __init__(
        self, out_dir: str | Path, on_progress: Callable[[int, int, str], None] | None = None
    ) -> None:
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.on_progress = on_progress
        self.last_progress: tuple[int, int, str] | None = None

    @property
    def episodes_path(self) -> Path:
        """Where episodes go."""
        return self.out_dir / EPISODES_FILE

    @property
    def metrics_path(self) -> Path:
        """Where metrics go."""
        return self.out_dir / METRICS_FILE

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Append one line per episode."""
        self._append(self.episodes_path, [episode_record(step, e) for e in episodes])

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one line with the step's metrics."""
        self._append(self.metrics_path, [{"step": step, **dict(metrics)}])

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Remember (and forward) the latest progress report."""
        self.last_progress = (done, total, message)
        if self.on_progress is not None:
            self.on_progress(done, total, message)

    @staticmethod
    def _append(path: Path, records: list[dict[str, Any]]) -> None:
        # One write per call: lines of one step land together, and a crash loses whole lines only.
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        with path.open("a", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()


def read_episodes(path: str | Path) -> list[dict[str, Any]]:
    """Read back the records of an ``episodes.jsonl`` file (plain dicts)."""
    with Path(path).open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]
