"""``envace push RUN --repo NAME [--dataset NAME]``: a run's checkpoint and episodes to the Hub.

Stages into ``--stage DIR`` (default: a temporary folder) with ``cli.hub_stage``, then uploads
each staged folder with ``huggingface_hub`` (``create_repo`` + ``upload_folder``; the token from
``HF_TOKEN`` or ``huggingface-cli login``). ``--stage-only`` stops after staging, for a look at
what would be pushed (the tests stage offline and load the folders back).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from envace_engine.cli.data import ROOT_HELP, _run_folder, data_root
from envace_engine.cli.hub_stage import StageError, find_checkpoint, stage_dataset, stage_model
from envace_engine.models import load_tokenizer, resolve


def push(
    run: Annotated[str, typer.Argument(help="run id (see `envace runs list`) or run directory")],
    repo: Annotated[
        str | None, typer.Option("--repo", help="model repo, e.g. you/smollm2-envace")
    ] = None,
    dataset: Annotated[
        str | None, typer.Option("--dataset", help="dataset repo for the run's episodes")
    ] = None,
    stage: Annotated[Path | None, typer.Option("--stage", help="staging folder")] = None,
    stage_only: Annotated[bool, typer.Option("--stage-only", help="stage, do not upload")] = False,
    private: Annotated[bool, typer.Option("--private", help="create private repos")] = False,
    root: Annotated[str | None, typer.Option("--root", help=ROOT_HELP)] = None,
) -> None:
    """Stage a run's checkpoint (with a model card) and/or its episodes (a ``messages``
    dataset with a card), then upload them to the Hugging Face Hub."""

    if not repo and not dataset:
        raise typer.BadParameter("give --repo (the model), --dataset (the episodes), or both")
    run_dir = _run_folder(run, data_root(root))
    folder = stage or Path(tempfile.mkdtemp(prefix=f"envace-push-{run_dir.name}-"))
    staged: list[tuple[str, str, Path]] = []
    try:
        if repo:
            staged.append((repo, "model", stage_model(run_dir, folder / "model", dataset)))
        if dataset:
            tokenizer = _tokenizer(run_dir)
            staged.append(
                (dataset, "dataset", stage_dataset(run_dir, folder / "dataset", tokenizer, repo))
            )
    except StageError as err:
        raise typer.BadParameter(str(err), param_hint="RUN") from err
    for name, kind, path in staged:
        typer.echo(f"staged {kind} for {name} in {path}")
    if stage_only:
        return
    for name, kind, path in staged:
        url = upload(name, kind, path, private)
        typer.echo(f"pushed {kind} {name}: {url}")


def _tokenizer(run_dir: Path) -> object:
    """The tokenizer that decodes the run's token ids: its checkpoint's, else its model's."""

    try:
        return load_tokenizer(resolve(str(find_checkpoint(run_dir))))
    except StageError:
        model = json.loads((run_dir / "run.json").read_text(encoding="utf-8")).get("model", "")
        return load_tokenizer(resolve(model))


def upload(repo: str, kind: str, folder: Path, private: bool) -> str:
    """Create ``repo`` (if new) and upload ``folder``; a clear error when the Hub says no."""
    from huggingface_hub import HfApi
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled

    api = HfApi()
    try:
        api.create_repo(repo, repo_type=kind, private=private, exist_ok=True)
        info = api.upload_folder(
            repo_id=repo, repo_type=kind, folder_path=folder, commit_message="envace push"
        )
    except OfflineModeIsEnabled as err:
        raise typer.BadParameter(
            f"cannot push {repo}: the Hub is offline (HF_HUB_OFFLINE=1); set HF_HUB_OFFLINE=0 "
            f"or upload {folder} later",
            param_hint="--repo" if kind == "model" else "--dataset",
        ) from err
    except HfHubHTTPError as err:
        raise typer.BadParameter(
            f"the Hub refused {kind} {repo}: {err} (log in with `huggingface-cli login` or set "
            "HF_TOKEN)",
            param_hint="--repo" if kind == "model" else "--dataset",
        ) from err
    return str(info)
