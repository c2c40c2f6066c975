"""Experiment tracking: a run's metrics also go to trackio or Weights & Biases (``report_to``).

``TrackingSink`` wraps a job's ``Sink``: everything is forwarded, and every ``metrics`` call is
also logged to the tracker at its step. trackio (local-first: a SQLite file under
``$TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``, shown by ``trackio show``) and wandb
are imported only when chosen; a missing package is an error naming what to install. The run's
config goes to the tracker once, at ``init``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, get_args

from envace_engine.config import ReportTo
from envace_engine.sink import Sink
from envace_engine.types import Episode

REPORT_TO: tuple[str, ...] = get_args(ReportTo)


class Tracker(Protocol):
    """An experiment tracker's run: log scalars at a step; finish once."""

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Record ``metrics`` at ``step``."""
        ...

    def finish(self) -> None:
        """Close the run."""
        ...


@dataclass(frozen=True)
class ModuleTracker:
    """trackio and wandb share this surface: ``module.log(dict, step=)``, ``module.finish()``."""

    module: Any

    def log(self, metrics: Mapping[str, float], step: int) -> None:
        """Forward to the tracker module."""
        self.module.log(dict(metrics), step=step)

    def finish(self) -> None:
        """Forward to the tracker module."""
        self.module.finish()


def open_tracker(
    report_to: str, project: str, name: str, config: Mapping[str, Any]
) -> Tracker | None:
    """Start a tracker run (``None`` for ``report_to = "none"``)."""
    if report_to == "none":
        return None
    if report_to not in REPORT_TO:
        raise ValueError(f"report_to {report_to!r}: choose one of {', '.join(REPORT_TO)}")
    try:
        module = importlib.import_module(report_to)
    except ImportError as err:
        raise ValueError(
            f"report_to = {report_to!r} needs the {report_to} package: pip install {report_to}"
        ) from err
    module.init(project=project, name=name, config=dict(config))
    return ModuleTracker(module)


@dataclass(frozen=True)
class TrackingSink:
    """A ``Sink`` forwarding to ``inner`` that also logs every step's metrics to ``tracker``."""

    inner: Sink
    tracker: Tracker

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Forward."""
        self.inner.episodes(step, episodes)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Forward, and log to the tracker."""
        self.inner.metrics(step, metrics)
        self.tracker.log(metrics, step)

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Forward."""
        self.inner.progress(done, total, message)
