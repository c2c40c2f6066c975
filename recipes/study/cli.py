"""``envace study``: the reproduction study (docs/study.md), and ``envace study report``.

``envace study --config configs/study-toy.toml [--resume RUN] [--set key=value]`` trains every
arm, evaluates every checkpoint and writes the report into the study's run folder (kind
``study``); ``--resume`` continues a killed study from what ``study.json`` records.
``envace study report RUN --format md|json`` prints the report of a study (finished or not).

Each unit (an arm's training, a checkpoint's evaluation) runs in a fresh program image: after a
unit the process saves the study and ``exec``s ``envace study --resume <folder>`` (same pid, so a
supervisor's signals and ``kill`` still reach it): a process that has trained an arm evaluates
more slowly than a fresh one, with identical results (recipes/study/RESULTS.md, *Cost*).
``--one-process`` keeps every unit in one process. With ``lanes`` > 1 this process supervises
that many lane processes (``--lane``, each also a fresh image per unit), which run units side
by side (``study.lanes``).
The arms and evaluations are runs of their own (``<study>--<arm>``, ``<study>--eval-<name>``,
``<study>--fidelity-<name>``), written through ``storage``'s run writers, so the studio shows
each of them too.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from envace_engine.config import ConfigError, build, data_root, format_keys, load
from recipes.study.config import RESUMABLE, RESUMABLE_KEYS, StudyConfig
from recipes.study.lanes import LanesError, alive, lane_main, supervise
from recipes.study.report import build_report, markdown
from recipes.study.runner import StartChanged, check_start, pause, redo_arms, run_study
from recipes.study.state import StudyState

# ``envace_engine.cli`` loads this module through its ``envace.commands`` entry point, so the
# engine's CLI modules are imported inside the commands here, never at the top (a cycle)

# how the study runs its next unit or a lane in a fresh program image: this recipe's own module
# (``python -m recipes.study`` is ``envace study``), so it needs no installed entry point
SELF = (sys.executable, "-m", "recipes.study")

app = typer.Typer(
    help="The reproduction study: arms from one SFT checkpoint, held-out evals, a report.",
    invoke_without_command=True,
)

ConfigOpt = Annotated[Path | None, typer.Option("--config", "-c", help="study TOML config")]
ResumeOpt = Annotated[str | None, typer.Option("--resume", help="study run id or dir to continue")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="override one key (repeatable; `envace study keys` lists them)"),
]
RedoOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--redo",
        help="with --resume: train this arm again from the start in a new run, its earlier "
        "run kept (repeatable)",
    ),
]
OneProcessOpt = Annotated[
    bool,
    typer.Option(
        "--one-process",
        help="run every unit in this process (default: a fresh process after each arm and "
        "each evaluation)",
    ),
]


UnitsOpt = Annotated[
    int | None,
    typer.Option(
        "--units",
        min=1,
        help="stop after this many units that do work (an arm's training, a checkpoint's "
        "evaluation), the study left paused: --resume continues it, here or in another clone "
        "from its committed folder (LoRA arms: docs/study.md)",
    ),
]
LaneOpt = Annotated[
    bool,
    typer.Option("--lane", hidden=True, help="run as one lane of a study (study.lanes)"),
]


class WriterSinks:
    """``study.runner.RunSinks`` on ``storage.shards.RunWriter`` runs under one data folder."""

    def __init__(self, root: Path, suite: str, report_to: str = "none") -> None:
        self.root, self.suite, self.report_to = root, suite, report_to

    def path(self, run_id: str) -> Path:
        """``<root>/runs/<run_id>``."""
        from storage.layout import run_dir

        return run_dir(self.root, run_id)

    @contextmanager
    def open(self, run_id: str, kind: str, model: str, config: Mapping[str, Any]) -> Iterator[Any]:
        """The run's writer: created the first time, reopened to continue it after that."""
        from storage.layout import MANIFEST
        from storage.shards import RunWriter

        path = self.path(run_id)
        if (path / MANIFEST).exists():
            writer = RunWriter(path)
        else:
            writer = RunWriter.create(
                self.root, kind, model=model, suite=self.suite, config=dict(config), run_id=run_id
            )

        # inside, not at the top: the plugin cycle (module comment above)
        from envace_engine.cli.train import ProgressSink, tracked

        with writer, tracked(writer, self.report_to, run_id, config) as sink:
            bar = ProgressSink(sink, run_id)  # steps of an arm (with tok/s), settings of an eval
            try:
                yield bar
            finally:
                bar.close()


def _study_config(
    config: Path | None, resume: str | None, overrides: list[str]
) -> tuple[Any, Path | None]:
    """The validated config, and the study folder when resuming. On resume, ``--set`` may change
    only ``[eval]``, ``lanes`` and ``model``'s path (``RESUMABLE``, ``RESUMABLE_KEYS``: the arms
    share every other setting; a moved SFT checkpoint must have the digest the study started
    from, which ``open_state`` checks); the change is recorded in the study's run.json, so
    later resumes and the report see it."""
    from storage.layout import read_manifest, rewrite_config, run_dir

    if resume is None:
        if config is None:
            raise ConfigError(
                "pass --config FILE.toml (e.g. configs/study-toy.toml) or --resume RUN"
            )
        return load(StudyConfig, config, overrides), None
    path = Path(resume) if Path(resume).is_dir() else run_dir(data_root(None), resume)
    if not (path / "run.json").is_file():
        raise ConfigError(f"--resume {resume}: no study at {path} (give a study run id or dir)")
    manifest = read_manifest(path)
    if manifest.kind != "study":
        raise ConfigError(f"--resume {resume}: {path} is a {manifest.kind} run, not a study")
    if config:
        raise ConfigError(
            f"--resume {resume} --config {config}: a resumed study keeps the config its run.json "
            "records (its arms were trained with it); change its evaluation with "
            "--set eval.KEY=VALUE, or start a new study with --config alone"
        )
    fixed = [o.split("=", 1)[0].strip() for o in overrides]
    fixed = [k for k in fixed if not k.startswith(RESUMABLE) and k not in RESUMABLE_KEYS]
    if fixed:
        raise ConfigError(
            f"--resume {resume} --set {', '.join(fixed)}: a resumed study keeps the settings its "
            "arms were trained with; only eval.*, lanes and model (the SFT checkpoint's path, "
            "same weights) may change (or start a new study with --config)"
        )
    data = build(StudyConfig, manifest.config, overrides)
    if overrides:
        rewrite_config(path, data.model_dump(mode="json"))
    return data, path


@app.callback()
def study(
    ctx: typer.Context,
    config: ConfigOpt = None,
    resume: ResumeOpt = None,
    overrides: SetOpt = None,
    redo: RedoOpt = None,
    one_process: OneProcessOpt = False,
    units: UnitsOpt = None,
    lane: LaneOpt = False,
) -> None:
    """Run (or --resume) the study of a config; see `envace study report` for its report."""
    if ctx.invoked_subcommand is not None:
        return
    from storage.shards import RunWriter

    try:
        cfg, folder = _study_config(config, resume, overrides or [])
    except (ConfigError, ValueError) as err:
        raise typer.BadParameter(str(err), param_hint="--config/--resume/--set") from err
    if lane:
        _lane(cfg, folder)
        return
    if units is not None and cfg.lanes > 1 and not one_process:
        raise typer.BadParameter(
            f"--units {units} with lanes = {cfg.lanes}: lanes run units side by side; use "
            "--set lanes=1 or --one-process to stop after a number of units",
            param_hint="--units",
        )
    if redo and folder is None:
        raise typer.BadParameter("--redo ARM continues a study: pass --resume RUN with it")
    if redo and folder is not None:  # before the study's writer opens: a bad name marks nothing
        try:
            redo_arms(cfg, folder, redo, typer.echo)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--redo") from err
    if folder is not None:  # before the writer opens: a changed start marks nothing failed
        try:
            check_start(cfg.model, StudyState.load(folder) or StudyState(folder.name))
        except StartChanged as err:
            raise typer.BadParameter(str(err), param_hint="model") from err
    root = data_root(cfg.root)
    if folder is None:
        writer = RunWriter.create(
            root,
            "study",
            model=cfg.model,
            suite=cfg.suite,
            config=cfg.model_dump(mode="json"),
            run_id=cfg.run_id,
        )
    else:
        writer = RunWriter(folder)

    def log(message: str) -> None:
        typer.echo(message)
        writer.progress(0, 1, message)

    sinks = WriterSinks(root, cfg.suite, cfg.report_to)
    with writer:
        if cfg.lanes > 1 and not one_process:
            _supervise(cfg, writer, sinks, log)
        else:
            state = run_study(cfg, writer.path, sinks, log, units=units if one_process else 1)
            if state.status != "done":  # stopped by units (one_process: only --units does)
                left = None if units is None else 0 if one_process else units - 1
                if left == 0:
                    pause(cfg, writer.path)
                    _pause(writer)
                    return
                _continue_fresh(writer, left)
    typer.echo(f"study {writer.run_id}: report in {writer.path}/report.md")


def _lane_argv(folder: Path) -> list[str]:
    return [*SELF, "--resume", str(folder), "--lane"]


def _supervise(cfg: Any, writer: Any, sinks: WriterSinks, log: Any) -> None:
    """Run the study in ``cfg.lanes`` lane processes (``study.lanes``)."""

    try:
        supervise(cfg, writer.path, _lane_argv(writer.path), log, sinks, writer.progress)
    except LanesError as err:
        raise typer.BadParameter(str(err), param_hint="lanes") from err


def _lane(cfg: Any, folder: Path | None) -> None:
    """One lane of a study that runs in lanes: claim a unit, run it, go on in a fresh image."""

    if folder is None:
        raise typer.BadParameter("--lane runs inside a study: pass --resume RUN with it")
    pid = os.getpid()

    def log(message: str) -> None:
        typer.echo(f"[lane {pid}] {message}")

    def fresh() -> NoReturn:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execv(sys.executable, _lane_argv(folder))

    sinks = WriterSinks(data_root(cfg.root), cfg.suite, cfg.report_to)
    lane_main(cfg, folder, sinks, log, fresh)


def _pause(writer: Any) -> None:
    """``--units`` is used up: record the study as ``paused`` and say how it goes on (not the
    count: each fresh program image is handed only the units left)."""
    message = f"paused, its --units done: envace study --resume {writer.path} goes on"
    typer.echo(f"study {writer.run_id}: {message}")
    writer.finish("paused", message)


def _continue_fresh(writer: Any, units: int | None) -> NoReturn:
    """Replace this process's image with ``envace study --resume <folder>`` (module doc), to
    run ``units`` more units (all that are left when ``None``)."""
    message = "next unit in a fresh process"
    typer.echo(f"study {writer.run_id}: {message}")
    writer.hand_over(message)
    sys.stdout.flush()
    sys.stderr.flush()
    argv = [*SELF, "--resume", str(writer.path)]
    argv += [] if units is None else ["--units", str(units)]
    os.execv(sys.executable, argv)


@app.command("report")
def report(
    run: Annotated[str, typer.Argument(help="study run id or run dir")],
    fmt: Annotated[str, typer.Option("--format", help="md | json")] = "md",
) -> None:
    """Print a study's report (from its study.json; works while it runs)."""
    from storage.layout import read_manifest, run_dir

    if fmt not in ("md", "json"):
        raise typer.BadParameter(f"--format {fmt!r}: use md or json", param_hint="--format")
    path = Path(run) if Path(run).is_dir() else run_dir(data_root(None), run)
    state = StudyState.load(path)
    if state is None:
        raise typer.BadParameter(f"{path} holds no study.json: not a study run", param_hint="RUN")
    cfg = build(StudyConfig, read_manifest(path).config)
    body = build_report(cfg, state)
    typer.echo(json.dumps(body, indent=1) if fmt == "json" else markdown(body))


@app.command("pause")
def pause_command(
    run: Annotated[str, typer.Argument(help="study run id or run dir")],
) -> None:
    """Mark a study that is not running (stopped or killed mid-unit, its machine gone) as
    paused, in its state, report and progress, so the studio shows it waiting to be resumed;
    ``envace study --resume RUN`` goes on from its last record."""
    from storage.layout import read_manifest, read_progress, run_dir
    from storage.shards import RunWriter

    path = Path(run) if Path(run).is_dir() else run_dir(data_root(None), run)
    state = StudyState.load(path)
    if state is None:
        raise typer.BadParameter(f"{path} holds no study.json: not a study run", param_hint="RUN")
    progress = read_progress(path)
    if progress.status == "running" and progress.pid and alive(progress.pid):
        raise typer.BadParameter(
            f"study {path.name} is running (pid {progress.pid}): stop it first "
            f"(kill {progress.pid}), then pause it",
            param_hint="RUN",
        )
    if state.status == "done":
        typer.echo(f"study {path.name} is done: nothing to pause")
        return
    pause(build(StudyConfig, read_manifest(path).config), path)
    RunWriter(path).finish("paused", f"paused: envace study --resume {path} goes on")
    typer.echo(f"study {path.name} paused: envace study --resume {path} goes on")


@app.command("keys")
def keys_command() -> None:
    """List every key a study config takes (its type, default and description): what
    ``--config FILE`` holds and ``--set KEY=VALUE`` overrides."""
    typer.echo(format_keys(StudyConfig))
