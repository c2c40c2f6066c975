"""``envace sft`` and ``envace train``: TOML config plus ``--set key=value`` overrides.

Both store their output as a run (``<root>/runs/<run_id>``: run.json, Parquet shards,
progress.json) through ``storage.shards.RunWriter``, imported here, in the composition root, so
the engine only ever sees a ``Sink``. A terminal progress bar follows the sink's progress calls.
Under ``torchrun``/``accelerate launch`` rank 0 picks the run id and writes the run; the other
ranks train without a sink (the trainer gathers their episodes to rank 0).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from tqdm import tqdm

from envace_engine.cli import compose
from envace_engine.config import (
    TRACE_EPISODES,
    ConfigError,
    SFTConfig,
    TrainConfig,
    build,
    data_root,
    format_keys,
    load,
)
from envace_engine.samplers.base import TokenCounting
from envace_engine.sink import Sink
from envace_engine.tracking import PROJECT, TrackingSink, open_tracker
from envace_engine.training.parallel import distributed
from envace_engine.types import Episode

CONFIG_HELP = "TOML config file (see configs/*.toml)"
SET_HELP = (
    "override one key, e.g. --set steps=10 --set rollout.temperature=0.7 (repeatable; --keys "
    "lists them)"
)
KEYS_HELP = "list every key of the config (its type, default and description) and exit"


class ProgressSink:
    """A ``Sink`` that forwards everything to ``inner`` and draws a tqdm progress bar.

    ``meter``: a sampler that counts its generated tokens; the bar then shows tok/s since start.
    Without one the rate comes from the metrics: a GRPO step's ``perf/tokens_per_s`` (its
    rollout's sampled tokens per second), or SFT's ``sft/padded_tokens`` summed over the steps
    (tokens run through the model per second since start).
    """

    def __init__(
        self, inner: Sink, desc: str, unit: str = "step", meter: TokenCounting | None = None
    ) -> None:
        self.inner = inner
        self.bar = tqdm(total=0, desc=desc, unit=unit, dynamic_ncols=True)
        self.desc, self.shown, self.message = desc, "", ""
        self.meter = meter
        self.started = (time.perf_counter(), meter.generated if meter else 0)
        self.trained_tokens = 0.0

    def episodes(self, step: int, episodes: Sequence[Episode]) -> None:
        """Forward a step's episodes."""
        self.inner.episodes(step, episodes)

    def metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Forward metrics and show the headline ones on the bar."""
        self.inner.metrics(step, metrics)
        keys = ("reward/mean", "success/real", "fidelity/score", "loss", "sft/loss")
        picked = [f"{k.split('/')[-1]}={metrics[k]:.3f}" for k in keys if k in metrics]
        self.shown = ", ".join(picked)
        rate = self._metric_rate(metrics)
        if rate is not None:
            self._show_rate(rate)
        self._postfix()

    def _metric_rate(self, metrics: Mapping[str, float]) -> float | None:
        if "perf/tokens_per_s" in metrics:
            return float(metrics["perf/tokens_per_s"])
        if "sft/padded_tokens" in metrics:
            self.trained_tokens += float(metrics["sft/padded_tokens"])
            return self.trained_tokens / max(time.perf_counter() - self.started[0], 1e-9)
        return None

    def progress(self, done: int, total: int, message: str = "") -> None:
        """Forward progress and move the bar (with tok/s when metered)."""
        self.inner.progress(done, total, message)
        self.bar.total = total
        self.bar.n = done
        if self.meter is not None:
            seconds = max(time.perf_counter() - self.started[0], 1e-9)
            self._show_rate((self.meter.generated - self.started[1]) / seconds)
        self.message = message
        self._postfix()

    def _show_rate(self, rate: float) -> None:
        self.bar.set_description_str(f"{self.desc} · {rate:.1f} tok/s", refresh=False)

    def _postfix(self) -> None:
        self.bar.set_postfix_str(", ".join(x for x in (self.message, self.shown) if x))

    def close(self) -> None:
        """Finish the bar."""
        self.bar.close()


@contextmanager
def tracked(
    sink: Sink,
    report_to: str,
    name: str,
    config: Mapping[str, Any],
    trace_episodes: int = TRACE_EPISODES,
) -> Iterator[Sink]:
    """``sink``, also logging its metrics, and ``trace_episodes`` episodes per step as traces,
    to ``report_to`` (trackio, wandb) while open."""

    tracker = open_tracker(report_to, project=PROJECT, name=name, config=config)
    if tracker is None:
        yield sink
        return
    try:
        yield TrackingSink(sink, tracker, trace_episodes)
    finally:
        tracker.finish()


def _fail(err: Exception) -> typer.BadParameter:
    return typer.BadParameter(str(err), param_hint="--config/--set")


def _open_run(root: str | None, kind: str, cfg: Any, run_id: str | None) -> Any:
    config = cfg.model_dump(mode="json")
    return compose.open_writer(root, None, kind, cfg.model, cfg.suite, config, run_id)


def keys_option(cls: type[BaseModel]) -> Any:
    """``--keys``: print ``cls``'s keys and exit before anything else is read (eager)."""

    def show(value: bool) -> None:
        if value:
            typer.echo(format_keys(cls))
            raise typer.Exit()

    return typer.Option("--keys", is_eager=True, callback=show, help=KEYS_HELP)


ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help=CONFIG_HELP)]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help=SET_HELP)]
ResumeOpt = Annotated[str | None, typer.Option("--resume", help="run id or run dir to continue")]


def sft(
    config: ConfigOpt = None,
    overrides: SetOpt = None,
    _keys: Annotated[bool, keys_option(SFTConfig)] = False,
) -> None:
    """SFT warm-up on reference trajectories of both roles; saves a checkpoint dir."""
    from envace_engine.training.sft import run_sft

    try:
        cfg = load(SFTConfig, config, overrides or [])
        writer = _open_run(cfg.root, "sft", cfg, cfg.run_id)
    except (ConfigError, ValueError) as err:
        raise _fail(err) from err
    out = Path(cfg.out_dir) if cfg.out_dir else writer.path / "model"
    settings = cfg.model_dump(mode="json")
    with writer, tracked(writer, cfg.report_to, writer.run_id, settings) as inner:
        sink = ProgressSink(inner, "sft")
        run_sft(cfg, out, sink)
    sink.close()
    typer.echo(f"run {writer.run_id}: model saved to {out}  (train with --set model={out})")


def train(
    config: ConfigOpt = None,
    resume: ResumeOpt = None,
    overrides: SetOpt = None,
    _keys: Annotated[bool, keys_option(TrainConfig)] = False,
) -> None:
    """Role-wise GRPO (modes envace, real-grpo, act-only); checkpoints; --resume continues."""
    from envace_engine.training.trainer import train as run_train

    d = distributed.init()
    try:
        cfg, run_dir = _train_setup(config, resume, overrides or [], d)
    except (ConfigError, ValueError, FileNotFoundError) as err:
        raise _fail(err) from err
    writer, sink = None, None
    if d.is_main:
        from storage.shards import RunWriter

        writer = RunWriter(run_dir)
        sink = ProgressSink(writer, f"train {writer.run_id}")
    try:
        if writer is not None and sink is not None:
            settings = cfg.model_dump(mode="json")
            traces = cfg.trace_episodes
            with writer, tracked(sink, cfg.report_to, writer.run_id, settings, traces) as inner:
                done = run_train(cfg, run_dir, inner, resume=resume is not None)
        else:
            done = run_train(cfg, run_dir, None, resume=resume is not None)
    finally:
        if sink is not None:
            sink.close()
        distributed.shutdown(d)
    if d.is_main:
        typer.echo(f"run {run_dir.name}: {done} steps done; checkpoints in {run_dir}/checkpoints")


def _train_setup(
    config: Path | None, resume: str | None, overrides: list[str], d: Any
) -> tuple[TrainConfig, Path]:
    """The validated config and the run dir (created by rank 0 for a new run)."""
    from storage.layout import read_manifest, run_dir

    if resume is None:
        cfg = load(TrainConfig, config, overrides)
        path = _open_run(cfg.root, "train", cfg, cfg.run_id).path if d.is_main else None
        return cfg, Path(distributed.share(str(path) if path else None, d))
    path = Path(resume) if Path(resume).is_dir() else run_dir(data_root(None), resume)
    if not (path / "run.json").is_file():
        raise FileNotFoundError(f"--resume {resume}: no run at {path} (give a run id or run dir)")
    stored = read_manifest(path).config
    if config is not None:  # a file given with --resume replaces the stored config
        return load(TrainConfig, config, overrides), path
    return build(TrainConfig, stored, overrides), path
