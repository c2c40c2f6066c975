"""``envace rollout``: run K episodes of a suite, print transcripts and a summary, write JSONL.

Example::

    envace rollout --model smollm2-135m --suite toy --mode rehearsal --episodes 8 --group 4 \\
        --out runs/rollout-demo
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from envace_engine.cli import compose
from envace_engine.cli.spec_options import own_option, spec_command
from envace_engine.cli.train import ProgressSink
from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics
from envace_engine.samplers.base import TokenCounting
from envace_engine.sink import FanoutSink, JsonlSink
from envace_engine.specs import RolloutSpec
from envace_engine.types import Episode, MetaKey, Role


def transcript(episode: Episode, width: int = 400) -> str:
    """A readable transcript: the agent context by role, each rehearsal under its call."""
    lines = [
        f"== episode {episode.id}  task {episode.task_id}  mode {episode.mode}  "
        f"stop {episode.stop_reason}" + (f" ({episode.stop_detail})" if episode.stop_detail else "")
    ]
    rehearsals = {r.call_index: r for r in episode.rehearsals}
    step = 0
    for segment in episode.segments[1:]:  # the prompt segment holds the system text
        text = segment.text.strip().replace("\n", "\n    ")
        lines.append(f"  [{segment.role}] {text[:width]}")
        if segment.role is Role.ACT:
            step += 1
            for index, record in enumerate(episode.calls):
                if record.step != step:
                    continue
                if index in rehearsals:
                    lines.append(f"    ~ rehearsed: {rehearsals[index].completion.text[:width]}")
                if record.real is not None and record.shown != "real":
                    real = record.real.value if record.real.ok else record.real.error
                    lines.append(f"    = real (hidden from the agent): {str(real)[:width]}")
    return "\n".join(lines)


def summary(episodes: Sequence[Episode], seconds: float) -> str:
    """Stop reasons, tokens, calls, pairs and drift of a batch, in a few lines."""
    stops = Counter(str(e.stop_reason) for e in episodes)
    sampled = sum(e.meta.get(MetaKey.SAMPLED_TOKENS, 0) for e in episodes)
    pairs = sum(1 for e in episodes for c in e.calls if c.rehearsed and c.real)
    return "\n".join(
        [
            f"episodes: {len(episodes)} in {seconds:.1f} s ({sampled} policy tokens, "
            f"{sampled / max(seconds, 1e-9):.1f} tok/s)",
            "stop reasons: " + ", ".join(f"{k} {v}" for k, v in stops.most_common()),
            f"tool calls: {sum(len(e.calls) for e in episodes)}, rehearsals: "
            f"{sum(len(e.rehearsals) for e in episodes)}, rehearsed+real pairs: {pairs}",
            f"prefix drift: {sum(e.drift for e in episodes)}",
        ]
    )


def run_rollout(spec: RolloutSpec, out: Path | None, run_dir: Path | None, show: int) -> None:
    """Run episodes, print transcripts and a summary; write JSON Lines and/or a stored run."""

    if out is None and run_dir is None:
        raise typer.BadParameter("say where to write: --out DIR (JSON Lines) or --run-dir DIR")
    n_tasks = spec.episodes // spec.group
    task_suite, tasks = compose.tasks(spec.suite, spec.split, n_tasks, seed=spec.seed)
    policy, tokenizer = compose.load(spec.model, dtype=spec.dtype)
    sim_sampler, sim_tokenizer = None, None
    if spec.simulator is not None:
        sim_sampler, sim_tokenizer = compose.load(
            spec.simulator, dtype=spec.dtype, hint="--simulator"
        )
    config = RolloutConfig(
        **spec.rollout_settings(), simulator=sim_sampler, simulator_tokenizer=sim_tokenizer
    )
    sinks: list[Any] = []
    if out is not None:
        sinks.append(JsonlSink(out))
    with contextlib.ExitStack() as stack:
        if run_dir is not None:
            writer = compose.open_writer(
                None, run_dir, "rollout", spec.model, spec.suite, spec.record()
            )
            sinks.append(stack.enter_context(writer))
        meter = policy if isinstance(policy, TokenCounting) else None
        bar = ProgressSink(FanoutSink(tuple(sinks)), "rollout", unit="episode", meter=meter)
        stack.callback(bar.close)

        def progress(done: int, total: int) -> None:
            bar.progress(done, total, "episodes ended")

        started = time.perf_counter()
        result = rollout(
            tasks,
            task_suite,
            policy,
            tokenizer,
            config,
            spec.group,
            progress=progress,
        )
        seconds = time.perf_counter() - started
        bar.episodes(0, result)
        bar.metrics(0, rollout_metrics(result))
    for episode in result[:show]:
        typer.echo(transcript(episode))
    typer.echo(summary(result, seconds))
    if out is not None:
        typer.echo(f"wrote {out / 'episodes.jsonl'}")
    if run_dir is not None:
        typer.echo(f"stored run {run_dir.name} in {run_dir}")


# the command's own options: where episodes go and what it prints, not what it computes
ROLLOUT_OWN = (
    own_option("out", ["--out"], Path | None, None, "JSON Lines output folder"),
    own_option("run_dir", ["--run-dir"], Path | None, None, "store as a run the studio shows here"),
    own_option("show", ["--show"], int, 4, "transcripts to print"),
)
rollout_command = spec_command(RolloutSpec, run_rollout, ROLLOUT_OWN)
