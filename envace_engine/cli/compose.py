"""The commands' composition root: what a job names, built into objects — its tasks, a model's
sampler and tokenizer, the run it writes. ``eval``, ``sweep``, ``rollout``, ``world serve``,
``sft`` and ``train`` build theirs here, so each is built one way.

torch, transformers and storage are imported on first use (inside the functions): ``envace
--help`` and ``envace studio`` (the studio never imports torch) import this module too.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import typer

from envace_engine.config import EVAL_CACHE_TOKENS, SamplerDtype, data_root
from envace_engine.environments import get_suite
from envace_engine.environments.base import Suite
from envace_engine.models import ModelError, load_tokenizer, resolve
from envace_engine.samplers import make_sampler
from envace_engine.types import Task


def tasks(
    suite_name: str,
    split: str,
    n_tasks: int,
    *,
    basis: str | None = None,
    seed: int | None = None,
) -> tuple[Suite, list[Task]]:
    """The suite and ``n_tasks`` of its ``split``: the first ones, or (``seed`` given) a
    sample drawn with that seed. A bad name, split or count is a ``BadParameter``."""
    try:
        suite = get_suite(suite_name, basis)
        pool = suite.tasks(split)
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--suite/--split/--basis") from err
    if seed is None:
        return suite, pool[:n_tasks]
    if n_tasks > len(pool):
        raise typer.BadParameter(f"{suite_name}/{split} has {len(pool)} tasks; asked for {n_tasks}")
    return suite, random.Random(seed).sample(pool, n_tasks)


def load(
    name: str,
    *,
    batch_size: int | None = None,
    dtype: SamplerDtype = "auto",
    bounded_cache: bool = False,
    hint: str = "--model",
) -> tuple[Any, Any]:
    """The sampler and tokenizer of model ``name`` (a registry name, checkpoint dir,
    BASE+ADAPTER or server). ``bounded_cache``: an embedded sampler's prefix cache is held to
    ``EVAL_CACHE_TOKENS`` between calls and during them, as evaluations hold it (a server keeps
    its own cache). A model that cannot load is a ``BadParameter`` naming ``hint``."""

    try:
        spec = resolve(name)
        tokenizer = load_tokenizer(spec)
        cache: dict[str, Any] = {}
        if bounded_cache and spec.kind == "hf":
            cache = {
                "prefix_cache_tokens": EVAL_CACHE_TOKENS,
                "call_cache_tokens": EVAL_CACHE_TOKENS,
            }
        sampler = make_sampler(
            spec, tokenizer=tokenizer, batch_size=batch_size, dtype=dtype, **cache
        )
    except ModelError as err:
        raise typer.BadParameter(str(err), param_hint=hint) from err
    return sampler, tokenizer


def open_writer(
    root: str | None,
    run_dir: Path | None,
    kind: str,
    model: str,
    suite: str,
    config: dict[str, Any],
    run_id: str | None = None,
) -> Any:
    """A ``RunWriter``: into ``run_dir`` (the studio's job folder; an existing run there is
    continued) or a new run under the data root (named ``run_id`` if given)."""
    from storage.layout import MANIFEST, RunManifest, utc_now
    from storage.schema import SCHEMA_VERSION
    from storage.shards import RunWriter

    if run_dir is None:
        return RunWriter.create(
            data_root(root), kind, model=model, suite=suite, config=config, run_id=run_id
        )
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
