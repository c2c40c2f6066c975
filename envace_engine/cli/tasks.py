"""``envace tasks``: list the suites, generate task files, show one task readably, and check
that every task's reference solution scores 1 (a self-test of tools and evaluator)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, NoReturn

import typer

from envace_engine.environments import get_suite, suite_names, whole_splits
from envace_engine.environments.check import check_suite
from envace_engine.tasks import TaskFileError, load_tasks, save_tasks

app = typer.Typer(help="Task suites and task files (JSONL).", no_args_is_help=True)


@app.command("list")
def list_suites() -> None:
    """List the suites with their splits and task counts."""

    width = max(len(name) for name in suite_names())
    for name in suite_names():
        suite = get_suite(name)
        splits: tuple[str, ...] = ("test", "base", "miss_func", "miss_param", "long_context")
        if name != "bfcl":
            splits = ("train", "test") if name.startswith("tau2-") else whole_splits(name)
        counts = ", ".join(f"{split} {len(suite.tasks(split))}" for split in splits)
        typer.echo(f"{name:{width}s} {counts}")


@app.command("check")
def check(
    suite: Annotated[str, typer.Option(help="any suite of `envace tasks list`")],
    split: Annotated[str | None, typer.Option(help="one split (default: every task)")] = None,
    basis: Annotated[
        str | None, typer.Option(help="bfcl official|strict, tau2 official|legacy")
    ] = None,
    agent: Annotated[
        str, typer.Option(help="reference (the solutions) | nothing (do-nothing baseline)")
    ] = "reference",
) -> None:
    """Replay each task's reference solution and report how many score 1 (no model needed).

    Exits 1 when a scored reference solution falls short (never for ``--agent nothing``).
    """

    try:
        chosen = get_suite(suite, basis)
        splits = (split,) if split else whole_splits(suite)
        tasks = [t for s in splits for t in chosen.tasks(s)]
        report = check_suite(chosen, tasks, agent)
    except ValueError as err:
        _fail(str(err))
    scored = report.tasks - report.unscored
    typer.echo(
        f"{report.suite} (basis {report.basis}, agent {agent}): {report.passed}/{report.tasks} "
        f"score 1; {report.unscored} unscored (need a judge); {report.seconds:.1f} s"
    )
    if report.components:
        parts = "  ".join(f"{k} {a}/{n}" for k, (a, n) in report.components.items())
        typer.echo(f"components at 1: {parts}")
    if report.failed:
        typer.echo(
            f"below 1: {', '.join(report.failed[:20])}{' ...' if len(report.failed) > 20 else ''}"
        )
    if agent == "reference" and report.passed < scored:
        raise typer.Exit(1)


@app.command("generate")
def generate(
    suite: Annotated[str, typer.Option(help="toy | bfcl-gen (bfcl: first N benchmark tasks)")],
    n: Annotated[int, typer.Option(min=1, help="number of tasks")],
    out: Annotated[Path, typer.Option(help="output JSONL file")],
    seed: Annotated[int, typer.Option(help="generation seed (same seed, same tasks)")] = 0,
) -> None:
    """Generate N tasks with their reference calls executed for real, and write them as JSONL."""

    if suite not in suite_names():
        raise typer.BadParameter(f"valid suites: {', '.join(suite_names())}", param_hint="--suite")
    chosen = get_suite(suite)
    t0 = time.perf_counter()
    generate_fn = getattr(chosen, "generate", None)
    # bfcl is the fixed benchmark: it is exported, and the seed does not apply.
    tasks = chosen.tasks("test")[:n] if generate_fn is None else generate_fn(n, seed)
    count = save_tasks(tasks, out)
    typer.echo(f"wrote {count} {suite} tasks to {out} in {time.perf_counter() - t0:.2f} s")


def _short(value: object, limit: int = 160) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _fail(message: str) -> NoReturn:
    # Plain text, not a rich error box: the box would wrap the file's line/field messages.
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(2)


@app.command("show")
def show(
    file: Annotated[Path, typer.Argument(help="task file (JSONL)")],
    index: int = typer.Option(0, min=0, help="0-based line index among the tasks"),
) -> None:
    """Print one task: turns, reference calls and results, tools, initial state."""

    try:
        tasks = load_tasks(file)
    except (TaskFileError, FileNotFoundError) as err:
        _fail(str(err))
    if index >= len(tasks):
        _fail(f"--index {index}: {file} has {len(tasks)} tasks (0..{len(tasks) - 1})")
    task = tasks[index]
    typer.echo(f"task {task.id}  (suite {task.suite}, {index + 1} of {len(tasks)})")
    if task.system:
        typer.echo(f"system: {task.system}")
    names = [t["function"]["name"] for t in task.tools]
    typer.echo(f"tools ({len(names)}): {', '.join(names)}")
    typer.echo(f"initial state: {_short(task.initial_state, 400)}")
    for turn, text in enumerate(task.user_turns):
        typer.echo(f"\n[turn {turn + 1}] user: {text}")
        calls = task.reference_calls[turn] if turn < len(task.reference_calls) else ()
        results = task.reference_results[turn] if turn < len(task.reference_results) else ()
        for i, call in enumerate(calls):
            args = ", ".join(
                f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in call.arguments.items()
            )
            typer.echo(f"  -> {call.name}({args})")
            if i < len(results):
                typer.echo(f"     = {_short(results[i])}")
    meta = {k: v for k, v in task.meta.items() if k not in ("path",)}
    typer.echo(f"\nmeta: {_short(meta, 400)}")
