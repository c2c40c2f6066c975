"""``envace rollout``: run K episodes of a suite, print transcripts and a summary, write JSONL.

Example::

    envace rollout --model smollm2-135m --suite toy --mode rehearsal --episodes 8 --group 4 \\
        --out runs/rollout-demo
"""

from __future__ import annotations

import contextlib
import random
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from envace_engine.cli.models import DtypeOpt
from envace_engine.config import ROLLOUT_DEFAULTS as _D
from envace_engine.config import SamplerDtype
from envace_engine.environments.base import Suite
from envace_engine.samplers.base import Sampler, TokenCounting
from envace_engine.types import Episode, MetaKey, Mode, Role, Task


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


def rollout_command(
    model: Annotated[
        str, typer.Option(help="policy: smollm2-135m, tiny, a checkpoint dir or sglang+")
    ],
    out: Annotated[
        Path | None, typer.Option(help="JSON Lines output folder (episodes.jsonl, metrics.jsonl)")
    ] = None,
    run_dir: Annotated[
        Path | None, typer.Option(help="store as a run the studio shows (Parquet shards) here")
    ] = None,
    suite: Annotated[str, typer.Option(help="task suite: toy, bfcl-gen or bfcl")] = "toy",
    mode: Annotated[Mode, typer.Option(help="who answers tool calls")] = Mode.REHEARSAL,
    episodes: Annotated[
        int, typer.Option(min=1, help="episodes in total (a multiple of --group)")
    ] = 4,
    group: Annotated[int, typer.Option(min=1, help="episodes per task (a GRPO group)")] = 1,
    seed: Annotated[int, typer.Option(help="task choice and sampling seed")] = 0,
    simulator: Annotated[
        str | None, typer.Option(help="frozen simulator model (simulator mode)")
    ] = None,
    split: Annotated[str, typer.Option(help="task split")] = "train",
    max_turns: Annotated[
        int, typer.Option(min=1, help="agent replies per user turn")
    ] = _D.max_turns,
    max_new_tokens: Annotated[
        int, typer.Option(min=1, help="tokens per act generation")
    ] = _D.max_new_tokens_act,
    max_new_tokens_rehearse: Annotated[
        int, typer.Option(min=1, help="tokens per world generation")
    ] = _D.max_new_tokens_rehearse,
    temperature: Annotated[
        float, typer.Option(min=0.0, help="sampling temperature")
    ] = _D.temperature,
    examples: Annotated[
        int, typer.Option(min=0, help="worked examples in both prompts")
    ] = _D.n_examples,
    grounded: Annotated[
        bool, typer.Option(help="reference results in the rehearse prompt")
    ] = _D.grounded_rehearsal,
    show: Annotated[int, typer.Option(min=0, help="transcripts to print")] = 4,
    dtype: DtypeOpt = "auto",
) -> None:
    """Run episodes, print transcripts and a summary; write JSON Lines and/or a stored run."""
    from envace_engine.cli.train import ProgressSink
    from envace_engine.rollout.loop import RolloutConfig, rollout, rollout_metrics
    from envace_engine.sink import FanoutSink, JsonlSink

    if out is None and run_dir is None:
        raise typer.BadParameter("say where to write: --out DIR (JSON Lines) or --run-dir DIR")
    if episodes % group:
        raise typer.BadParameter(f"{episodes} is not a multiple of --group {group}")
    if (mode is Mode.SIMULATOR) != (simulator is not None):
        raise typer.BadParameter("--simulator MODEL is needed in simulator mode, and only there")
    task_suite, pool, tasks = _pick_tasks(suite, split, episodes // group, seed)
    tokenizer, policy, sim_tokenizer, sim_sampler = _load_samplers(model, simulator, dtype)
    config = RolloutConfig(
        mode=mode,
        max_turns=max_turns,
        max_new_tokens_act=max_new_tokens,
        max_new_tokens_rehearse=max_new_tokens_rehearse,
        temperature=temperature,
        seed=seed,
        grounded_rehearsal=grounded,
        n_examples=examples,
        simulator=sim_sampler,
        simulator_tokenizer=sim_tokenizer,
    )
    sinks: list[Any] = []
    if out is not None:
        sinks.append(JsonlSink(out))
    with contextlib.ExitStack() as stack:
        if run_dir is not None:
            from envace_engine.cli.eval import open_writer

            settings = {"mode": str(mode), "episodes": episodes, "group": group, "seed": seed}
            sinks.append(
                stack.enter_context(open_writer(None, run_dir, "rollout", model, suite, settings))
            )

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
            group,
            example_pool=pool,
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


def _pick_tasks(
    suite: str, split: str, n_tasks: int, seed: int
) -> tuple[Suite, list[Task], list[Task]]:
    """The suite, its split (the worked-example pool) and ``n_tasks`` tasks drawn with ``seed``."""
    from envace_engine.environments import get_suite

    try:
        task_suite = get_suite(suite)
        pool = task_suite.tasks(split)
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    if n_tasks > len(pool):
        raise typer.BadParameter(f"{suite}/{split} has {len(pool)} tasks; asked for {n_tasks}")
    return task_suite, pool, random.Random(seed).sample(pool, n_tasks)


def _load_samplers(
    model: str, simulator: str | None, dtype: SamplerDtype
) -> tuple[Any, Sampler, Any, Sampler | None]:
    """Policy tokenizer and sampler, and the simulator's (or None, None); ``dtype`` is both
    embedded samplers' GEMM dtype."""
    from envace_engine.models import ModelError, load_tokenizer, resolve
    from envace_engine.samplers import make_sampler

    try:
        spec = resolve(model)
        tokenizer = load_tokenizer(spec)
        policy = make_sampler(spec, tokenizer=tokenizer, dtype=dtype)
        if simulator is None:
            return tokenizer, policy, None, None
        sim_spec = resolve(simulator)
        sim_tokenizer = load_tokenizer(sim_spec)
        sim = make_sampler(sim_spec, tokenizer=sim_tokenizer, dtype=dtype)
        return tokenizer, policy, sim_tokenizer, sim
    except ModelError as err:
        raise typer.BadParameter(str(err)) from err
