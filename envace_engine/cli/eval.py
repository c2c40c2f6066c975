"""``envace eval`` and ``envace sweep``: real-environment evaluation and rehearsal-budget sweeps.

Both write a run (``<root>/runs/<run_id>``, or the folder given by ``--run-dir`` as the studio's
job manager does) through ``storage.shards.RunWriter``; layout in docs/rehearsal.md. The model,
storage and torch are imported inside the commands so ``envace --help`` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from envace_engine.cli.users import (
    BasisOpt,
    JudgeOpt,
    StepsOpt,
    UserOpt,
    UserTempOpt,
    UserTokensOpt,
)
from envace_engine.config import EVAL_BATCH_SIZE, EVAL_TEMPERATURE, ReportTo
from envace_engine.config import ROLLOUT_DEFAULTS as _D
from envace_engine.samplers.base import TokenCounting
from envace_engine.testtime.memory import MemoryConfig

_MEMORY_TOKENS = MemoryConfig().max_new_tokens

ModelOpt = Annotated[
    list[str], typer.Option("--model", help="model name, checkpoint dir or sglang+http://HOST:PORT")
]
SuiteOpt = Annotated[
    str, typer.Option("--suite", help="task suite: toy, bfcl-gen, bfcl, tau2-airline, tau2-retail")
]
SplitOpt = Annotated[
    str | None,
    typer.Option("--split", help="split (default: validation; bfcl: base = multi_turn_base)"),
]
TasksOpt = Annotated[int, typer.Option("--n-tasks", "--tasks", min=1, help="first K tasks")]
RepeatsOpt = Annotated[int, typer.Option("--repeats", min=1, help="episodes per task (pass^k)")]
RootOpt = Annotated[str | None, typer.Option("--root", help="data folder ($ENVACE_HOME, ./runs)")]
ReportOpt = Annotated[
    ReportTo, typer.Option("--report-to", help="also log metrics to trackio or wandb")
]
RunDirOpt = Annotated[Path | None, typer.Option("--run-dir", help="write into this run folder")]
TempOpt = Annotated[float, typer.Option("--temperature", min=0.0, help="sampling temperature")]
SeedOpt = Annotated[int, typer.Option("--seed", help="sampling seed")]
TurnsOpt = Annotated[int, typer.Option("--max-turns", min=1, help="agent replies per user turn")]
ActOpt = Annotated[
    int | None,
    typer.Option(
        "--max-new-tokens-act", min=1, help="tokens per reply (default: the checkpoint's)"
    ),
]
WorldOpt = Annotated[
    int | None,
    typer.Option(
        "--max-new-tokens-rehearse",
        min=1,
        help="tokens per imagined result (default: checkpoint's)",
    ),
]
HistoryOpt = Annotated[
    bool | None,
    typer.Option(
        "--rehearse-history/--no-rehearse-history",
        help="conversation in rehearse prompts (default: the checkpoint's)",
    ),
]
MemoryOpt = Annotated[int, typer.Option("--memory-tokens", min=1, help="tokens per memory")]
ExamplesOpt = Annotated[
    int | None,
    typer.Option(
        "--examples", min=0, help="worked examples in prompts (default: the checkpoint's)"
    ),
]
ThresholdOpt = Annotated[
    float, typer.Option("--success-threshold", help="reward that counts as success (0, 1]")
]


def _fail(err: Exception, hint: str) -> typer.BadParameter:
    return typer.BadParameter(str(err), param_hint=hint)


def _tasks(
    suite_name: str, split: str | None, n_tasks: int, basis: str | None = None
) -> tuple[Any, list[Any], list[Any]]:
    """The suite, its first ``n_tasks`` tasks of ``split`` and the worked-example pool."""
    from envace_engine.environments import get_suite

    suite = get_suite(suite_name, basis)
    held_out = "test" if suite_name.startswith("tau2-") else "validation"
    split = split or ("base" if suite_name == "bfcl" else held_out)
    tasks = suite.tasks(split)[:n_tasks]
    # bfcl is held out (no train split): worked examples come from bfcl-gen, same backends.
    pool = get_suite("bfcl-gen").tasks("train") if suite_name == "bfcl" else suite.tasks("train")
    return suite, tasks, pool


def _checkpoints(models: Sequence[str], batch_size: int) -> Iterator[Any]:
    """Load each model when its turn comes (one in memory at a time)."""
    from envace_engine.models import load_tokenizer, resolve
    from envace_engine.samplers import make_sampler
    from envace_engine.testtime.evaluate import Checkpoint

    for name in models:
        spec = resolve(name)
        tokenizer = load_tokenizer(spec)
        options: dict[str, Any] = {"batch_size": batch_size} if spec.kind == "hf" else {}
        yield Checkpoint(name, make_sampler(spec, tokenizer=tokenizer, **options), tokenizer)


def open_writer(
    root: str | None,
    run_dir: Path | None,
    kind: str,
    model: str,
    suite: str,
    config: dict[str, Any],
) -> Any:
    """A ``RunWriter`` for ``run_dir`` (the studio's job folder) or a new run under the root."""
    from envace_engine.config import data_root
    from storage.layout import MANIFEST, RunManifest, utc_now
    from storage.schema import SCHEMA_VERSION
    from storage.shards import RunWriter

    if run_dir is None:
        return RunWriter.create(data_root(root), kind, model=model, suite=suite, config=config)
    if (run_dir / MANIFEST).exists():
        return RunWriter(run_dir)
    manifest = RunManifest(
        run_id=run_dir.name,
        kind=kind,
        model=model,
        suite=suite,
        config=config,
        created_at=utc_now(),
        schema_version=SCHEMA_VERSION,
    )
    return RunWriter(run_dir, manifest)


@dataclass(frozen=True)
class _Job:
    """What both commands need once their options are checked (before any model loads)."""

    suite: Any
    tasks: list[Any]
    pool: list[Any]
    rollout: Any
    config: Any
    record: dict[str, Any]


def prompt_options(models: Sequence[str], opts: dict[str, Any]) -> dict[str, Any]:
    """``opts`` with every unset prompt option taken from the checkpoints' record, else the
    defaults: a checkpoint is evaluated with the prompts it was trained with. Checkpoints
    recorded with different settings need the options given explicitly."""
    from envace_engine.config import checkpoint_prompts

    records = [r for r in (checkpoint_prompts(m) for m in models) if r]
    if any(r != records[0] for r in records[1:]):
        raise typer.BadParameter(
            f"the checkpoints were trained with different prompt settings ({records}): pass "
            "--examples, --max-new-tokens-act, --max-new-tokens-rehearse and "
            "--rehearse-history explicitly",
            param_hint="--model",
        )
    recorded = {**_D.model_dump(), **(records[0] if records else {})}
    names = {
        "examples": "n_examples",
        "max_new_tokens_act": "max_new_tokens_act",
        "max_new_tokens_rehearse": "max_new_tokens_rehearse",
        "rehearse_history": "rehearse_history",
    }
    out = dict(opts)
    for option, key in names.items():
        if out.get(option) is None:
            out[option] = recorded[key]
    return out


def _prepare(suite: str, split: str | None, n_tasks: int, opts: dict[str, Any]) -> _Job:
    """Validate options into configs; every bad value raises ``BadParameter`` naming it."""
    from envace_engine.environments.base import ScoringBasis
    from envace_engine.rollout.loop import RolloutConfig
    from envace_engine.testtime.evaluate import EvalConfig
    from envace_engine.testtime.memory import MemoryConfig
    from envace_engine.testtime.rehearsal import RehearsalConfig

    try:
        rehearsal = RehearsalConfig(
            opts.get("budget", 0),
            opts.get("rehearsal", "parallel"),
            MemoryConfig(opts["memory_tokens"]),
        )
        config = EvalConfig(opts["repeats"], rehearsal, opts["success_threshold"])
        rollout = RolloutConfig(
            temperature=opts["temperature"],
            seed=opts["seed"],
            max_turns=opts["max_turns"],
            max_new_tokens_act=opts["max_new_tokens_act"],
            max_new_tokens_rehearse=opts["max_new_tokens_rehearse"],
            n_examples=opts["examples"],
            rehearse_history=opts["rehearse_history"],
            max_steps=opts.get("max_steps", 200),
        )
        suite_obj, tasks, pool = _tasks(suite, split, n_tasks, opts.get("basis"))
    except ValueError as err:
        raise _fail(err, "--suite/--split/--basis/--budget/--rehearsal") from err
    record = {"split": split, "n_tasks": len(tasks), **opts}
    if isinstance(suite_obj, ScoringBasis):  # the basis every score of the run used
        record["basis"] = suite_obj.basis
    return _Job(suite_obj, tasks, pool, rollout, config, record)


def _recorded(params: dict[str, Any]) -> dict[str, Any]:
    """The command's options that go into the run manifest (and into ``_prepare``)."""
    return {k: v for k, v in params.items() if k in _RECORDED}


def _table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0])
    width = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    lines = ["  ".join(k.ljust(width[k]) for k in keys)]
    lines += ["  ".join(str(r[k]).ljust(width[k]) for k in keys) for r in rows]
    return "\n".join(lines)


def _eval_rows(result: Any) -> list[dict[str, Any]]:
    """One printed row per task."""
    n = result.config.repeats
    return [
        {
            "task": t.task_id,
            "rewards": ",".join("-" if r is None else f"{r:.2f}" for r in t.rewards),
            "successes": f"{t.successes}/{n}",
            "calls": f"{t.real_calls:.1f}",
            "act_tok": f"{t.act_tokens:.0f}",
            "imag_tok": f"{t.rehearsal_tokens:.0f}",
            "mem_tok": f"{t.memory_tokens:.0f}",
        }
        for t in result.tasks
    ]


def _sweep_rows(points: Sequence[Any]) -> list[dict[str, Any]]:
    """One printed row per sweep point; ``*`` marks the success-vs-overhead Pareto front."""
    from envace_engine.testtime.evaluate import pareto_front

    def overhead(m: Any) -> float:
        return m["sweep/rehearsal_tokens"] + m["sweep/memory_tokens"]

    front = set(pareto_front([(overhead(p.metrics), p.metrics["sweep/success"]) for p in points]))
    return [
        {
            "step": p.step,
            "model": p.checkpoint,
            "setting": p.setting.label,
            "success": f"{p.metrics['sweep/success']:.3f}",
            "reward": f"{p.metrics['sweep/reward']:.3f}",
            "imag_tok": f"{p.metrics['sweep/rehearsal_tokens']:.0f}",
            "mem_tok": f"{p.metrics['sweep/memory_tokens']:.0f}",
            "act_tok": f"{p.metrics['sweep/act_tokens']:.0f}",
            "wall_s": f"{p.metrics['sweep/wall_s']:.0f}",
            "pareto": "*" if i in front else "",
        }
        for i, p in enumerate(points)
    ]


BudgetOpt = Annotated[int, typer.Option("--budget", min=0, help="imagined episodes (0 = plain)")]
ModeOpt = Annotated[str, typer.Option("--rehearsal", help="parallel | sequential")]
BudgetsOpt = Annotated[str, typer.Option("--budgets", help="comma-separated, e.g. 0,1,2,4")]
ModesOpt = Annotated[str, typer.Option("--rehearsal", help="modes, e.g. parallel,sequential")]
BatchOpt = Annotated[int, typer.Option("--batch-size", min=1, help="prompts per forward batch")]


def eval_command(
    model: ModelOpt,
    suite: SuiteOpt,
    split: SplitOpt = None,
    n_tasks: TasksOpt = 8,
    repeats: RepeatsOpt = 1,
    budget: BudgetOpt = 0,
    rehearsal: ModeOpt = "parallel",
    temperature: TempOpt = EVAL_TEMPERATURE,
    seed: SeedOpt = 0,
    max_turns: TurnsOpt = _D.max_turns,
    max_new_tokens_act: ActOpt = None,
    max_new_tokens_rehearse: WorldOpt = None,
    rehearse_history: HistoryOpt = None,
    memory_tokens: MemoryOpt = _MEMORY_TOKENS,
    examples: ExamplesOpt = None,
    success_threshold: ThresholdOpt = 1.0,
    batch_size: BatchOpt = EVAL_BATCH_SIZE,
    root: RootOpt = None,
    run_dir: RunDirOpt = None,
    basis: BasisOpt = None,
    user: UserOpt = None,
    judge_url: JudgeOpt = None,
    max_steps: StepsOpt = 200,
    user_max_new_tokens: UserTokensOpt = 128,
    user_temperature: UserTempOpt = 0.0,
    report_to: ReportOpt = "none",
) -> None:
    """Evaluate a model in the real environment (optionally after private rehearsal)."""
    from envace_engine.cli.train import ProgressSink, tracked
    from envace_engine.cli.users import judge_config, with_user
    from envace_engine.rollout.rewards import make_reward
    from envace_engine.testtime.evaluate import evaluate

    if len(model) != 1:
        raise typer.BadParameter("eval takes one --model (use `envace sweep` for several)")
    opts = prompt_options(model, _recorded(locals()))
    job = _prepare(suite, split, n_tasks, opts)
    (checkpoint,) = _checkpoints(model, batch_size)
    job = with_user(job, opts, model[0], checkpoint, batch_size)
    writer = open_writer(root, run_dir, "eval", model[0], suite, job.record)
    with writer, tracked(writer, report_to, writer.run_id, job.record) as inner:
        sampler = checkpoint.sampler
        meter = sampler if isinstance(sampler, TokenCounting) else None
        sink = ProgressSink(inner, f"eval {suite}", unit="episode", meter=meter)
        try:
            total = len(job.tasks) * job.config.repeats  # real episodes, one per task and repeat
            sink.progress(0, total, "starting")
            result = evaluate(
                job.tasks,
                job.suite,
                checkpoint.sampler,
                checkpoint.tokenizer,
                job.rollout,
                job.config,
                make_reward("state", job.suite, judge_config(judge_url)),
                example_pool=job.pool,
                run_id="ev",
                progress=sink.progress,
            )
            metrics = result.metrics("eval")
            sink.episodes(0, result.episodes)
            sink.metrics(0, metrics)
            sink.progress(total, total, "done")
        finally:
            sink.close()
    typer.echo(_table(_eval_rows(result)))
    typer.echo(f"run {writer.run_id} in {writer.path}")
    typer.echo(json.dumps({k: round(v, 4) for k, v in metrics.items()}))


def sweep_command(
    model: ModelOpt,
    suite: SuiteOpt,
    split: SplitOpt = None,
    n_tasks: TasksOpt = 8,
    repeats: RepeatsOpt = 1,
    budgets: BudgetsOpt = "0,1,2,4",
    rehearsal: ModesOpt = "parallel,sequential",
    temperature: TempOpt = EVAL_TEMPERATURE,
    seed: SeedOpt = 0,
    max_turns: TurnsOpt = _D.max_turns,
    max_new_tokens_act: ActOpt = None,
    max_new_tokens_rehearse: WorldOpt = None,
    rehearse_history: HistoryOpt = None,
    memory_tokens: MemoryOpt = _MEMORY_TOKENS,
    examples: ExamplesOpt = None,
    success_threshold: ThresholdOpt = 1.0,
    batch_size: BatchOpt = EVAL_BATCH_SIZE,
    root: RootOpt = None,
    run_dir: RunDirOpt = None,
    report_to: ReportOpt = "none",
) -> None:
    """Sweep rehearsal budget x mode (x checkpoints: repeat --model) and store the grid."""
    from envace_engine.cli.train import ProgressSink, tracked
    from envace_engine.rollout.rewards import make_reward
    from envace_engine.testtime.evaluate import run_sweep, sweep_settings

    opts = prompt_options(model, _recorded(locals()))
    opts.pop("rehearsal")  # a list of modes here, not one mode
    try:
        numbers = [int(b) for b in budgets.split(",") if b.strip()]
        settings = sweep_settings(numbers, [m.strip() for m in rehearsal.split(",") if m.strip()])
    except ValueError as err:
        raise _fail(err, "--budgets/--rehearsal") from err
    job = _prepare(suite, split, n_tasks, opts)
    record = {**job.record, "budgets": numbers, "modes": rehearsal, "checkpoints": list(model)}
    writer = open_writer(root, run_dir, "sweep", ",".join(model), suite, record)
    with writer, tracked(writer, report_to, writer.run_id, record) as inner:
        sink = ProgressSink(inner, f"sweep {suite}")
        try:
            points = run_sweep(
                job.tasks,
                job.suite,
                _checkpoints(model, batch_size),
                job.rollout,
                job.config,
                settings,
                make_reward("state", job.suite),
                sink,
                n_checkpoints=len(model),
                example_pool=job.pool,
            )
        finally:
            sink.close()
    typer.echo(_table(_sweep_rows(points)))
    typer.echo(f"run {writer.run_id} in {writer.path}")


# Options recorded in the run manifest (and read back by ``_prepare``).
_RECORDED = frozenset(
    {
        "repeats",
        "budget",
        "rehearsal",
        "temperature",
        "seed",
        "max_turns",
        "max_new_tokens_act",
        "max_new_tokens_rehearse",
        "memory_tokens",
        "examples",
        "rehearse_history",
        "success_threshold",
        "basis",
        "user",
        "judge_url",
        "max_steps",
        "user_max_new_tokens",
        "user_temperature",
    }
)
