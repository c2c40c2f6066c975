"""``envace export``, ``envace import`` and ``envace runs list``: run data in and out.

These read and write run directories directly. Labels live in the studio's database, which only
one process may open: when a running studio holds it, export goes on without labels and import
leaves the labels for a later import, saying so.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from envace_engine.config import data_root as configured

runs_app = typer.Typer(help="Runs in the studio data folder.", no_args_is_help=True)

ROOT_HELP = "studio data folder (default: $ENVACE_HOME or ./runs)"


def data_root(root: str | None) -> Path:
    """The studio data folder: ``--root``, else $ENVACE_HOME, else ./runs (absolute)."""

    return configured(root).resolve()


def _run_folder(run: str, root: Path) -> Path:
    from storage.layout import MANIFEST, run_dir

    path = Path(run)
    if (path / MANIFEST).is_file():
        return path
    try:
        candidate = run_dir(root, run)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="RUN") from err
    if not (candidate / MANIFEST).is_file():
        raise typer.BadParameter(
            f"no run {run!r}: not a run directory and not under {root}/runs "
            "(see `envace runs list`)",
            param_hint="RUN",
        )
    return candidate


def export(
    run: Annotated[str, typer.Argument(help="run id (in the data folder) or a run directory")],
    out: Annotated[Path, typer.Option("--out", help="folder to write the export into")],
    fmt: Annotated[str, typer.Option("--format", help="parquet or jsonl")] = "parquet",
    root: Annotated[str | None, typer.Option(help=ROOT_HELP)] = None,
) -> None:
    """Export a run: one Parquet or JSON Lines file per table, plus its labels."""
    from storage.export import FORMATS, export_run
    from storage.store import Store, StoreLockedError

    if fmt not in FORMATS:
        raise typer.BadParameter(f"must be one of {', '.join(FORMATS)}", param_hint="--format")
    folder = _run_folder(run, data_root(root))
    labels = None
    try:
        with Store(data_root(root)) as store:
            labels = store.export_labels(folder.name)
    except StoreLockedError:
        typer.echo("note: the studio holds the database; exporting without labels", err=True)
    files = export_run(folder, out, fmt, labels)
    for path in files:
        typer.echo(f"wrote {path}")


def import_(
    src: Annotated[Path, typer.Argument(help="an export folder or a run directory")],
    run_id: Annotated[str | None, typer.Option(help="import under this run id instead")] = None,
    root: Annotated[str | None, typer.Option(help=ROOT_HELP)] = None,
) -> None:
    """Import an exported run (or copy a run directory) into the data folder."""
    from storage.export import import_run, read_labels
    from storage.store import Store, StoreLockedError

    folder = data_root(root)
    try:
        manifest = import_run(src, folder, run_id)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="SRC") from err
    typer.echo(f"imported run {manifest.run_id} into {folder / 'runs' / manifest.run_id}")
    labels = read_labels(src)
    try:
        with Store(folder) as store:
            store.register_run(manifest, origin="imported")
            if labels is not None:
                labels["run_id"] = manifest.run_id
                typer.echo(f"imported {store.import_annotations(labels)} labels")
    except StoreLockedError:
        typer.echo("note: the studio holds the database; labels were not imported", err=True)


@runs_app.command("list")
def list_runs(root: Annotated[str | None, typer.Option(help=ROOT_HELP)] = None) -> None:
    """List runs with their kind, model, suite, status, schema version and episode count; then
    every run folder or shard this build cannot read, and why."""
    from storage.layout import open_manifest, read_progress, runs_dir
    from storage.schema import SchemaVersionError

    folder = data_root(root)
    paths = sorted(p.parent for p in runs_dir(folder).glob("*/run.json"))
    if not paths:
        typer.echo(f"no runs under {runs_dir(folder)}")
        return
    typer.echo(
        f"{'run':32s} {'kind':8s} {'model':16s} {'suite':10s} {'status':10s} schema episodes"
    )
    problems = []
    for path in paths:
        try:
            m = open_manifest(path)
        except (ValueError, SchemaVersionError) as err:
            problems.append(f"{path.name}: {err}")
            continue
        n, bad = _count_episodes(path)
        problems += [f"{path.name}: {shard}: {why}" for shard, why in bad]
        status = read_progress(path).status or "-"
        typer.echo(
            f"{m.run_id:32s} {m.kind:8s} {m.model:16s} {m.suite:10s} {status:10s} "
            f"{m.schema_version:6d} {n}"
        )
    if problems:
        typer.echo(f"\n{len(problems)} unreadable:")
        for line in problems:
            typer.echo(f"  {line}")


def _count_episodes(run: Path) -> tuple[int, list[tuple[str, str]]]:
    """Episodes in a run's shards, and (shard, reason) for each shard that cannot be read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, bad = 0, []
    for table in ("episodes", "segments", "calls", "rehearsals", "metrics"):
        for shard in sorted((run / table).glob("*.parquet")):
            try:
                rows = pq.read_metadata(shard).num_rows
            except (OSError, pa.ArrowException) as err:
                bad.append((f"{table}/{shard.name}", str(err).splitlines()[0]))
                continue
            n += rows if table == "episodes" else 0
    return n, bad


@runs_app.command("upgrade")
def upgrade(
    run: Annotated[str, typer.Argument(help="run id under --root, or a run directory")],
    root: Annotated[str | None, typer.Option(help=ROOT_HELP)] = None,
) -> None:
    """Rewrite a run written by an older schema version in the current layout (every reader
    opens older runs as they are: this is for runs you ship or read with other tools)."""
    from storage.schema import SCHEMA_VERSION
    from storage.upgrade import upgrade_run

    folder = _run_folder(run, data_root(root))
    shards = upgrade_run(folder)
    typer.echo(f"{folder.name}: schema version {SCHEMA_VERSION}, {len(shards)} shard(s) rewritten")
