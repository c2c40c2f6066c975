"""Weight sync to SGLang servers: write each step's weights, ``/update_weights_from_disk``, prune.

The in-process ``HFSampler`` shares the trained model object and needs none of this. An SGLang
sampler runs in other processes (other machines), so after every optimizer step rank 0 writes a
full Hugging Face checkpoint under ``<run>/weights/step-N`` and asks every server to load it as
weight version ``N`` (docs/protocols.md §1); docs/training.md has the operational details.

A LoRA run (``[lora] enabled``) sends only its adapter: rank 0 writes it under
``<run>/weights/adapter-N``, every server loads it under a new name (``/load_lora_adapter``),
requests name it from then on (``lora_path``), and the servers drop the previous one
(``/unload_lora_adapter``). The servers keep serving the base model they were started on.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from envace_engine import adapters
from envace_engine.models import resolve
from envace_engine.samplers import Sampler, make_sampler
from envace_engine.samplers.base import AdapterReceiver, WeightReceiver
from envace_engine.samplers.sglang import SamplerError, SGLangSampler
from envace_engine.training.parallel import distributed


@dataclass(frozen=True)
class WeightSource:
    """What a push reads: the sampler to update, the weights to send and the ranks.

    ``model`` and ``tokenizer`` are the trained (full, unsharded) transformers objects;
    ``save_pretrained`` of both makes the checkpoint the servers load.
    """

    sampler: Sampler
    model: Any  # transformers PreTrainedModel
    tokenizer: Any  # transformers PreTrainedTokenizerBase
    dist: distributed.Dist
    adapter: Any | None = None  # a LoRA run's peft model: its adapter alone is pushed


def sync_weights(source: WeightSource, run_dir: Path, step: int) -> None:
    """Push the weights after ``step`` optimizer steps to an out-of-process sampler (SGLang).

    In-process samplers share the model object and need nothing. Rank 0 writes a full copy to
    ``<run>/weights/step-N``, asks every server to load it as weight version ``N``, and only
    then deletes older copies: until the servers confirm, the last pushed copy is the only one
    on disk of what they serve (checkpoints are sparser and pruned). Rank 0 shares the outcome,
    so a failed push stops every rank with the same error instead of leaving some at a barrier.
    """
    receiver = source.sampler
    if not isinstance(receiver, WeightReceiver):
        return
    error = None
    if source.dist.is_main:
        if source.adapter is not None and isinstance(receiver, AdapterReceiver):
            error = _push_adapter(source.adapter, receiver, Path(run_dir), step)
        else:
            error = _push_weights(source, receiver, Path(run_dir), step)
    error = distributed.share(error, source.dist)
    if error is not None:
        raise WeightSyncError(error)


WEIGHTS = "weights"  # <run>/weights/step-000012: the copy the SGLang servers loaded last


class WeightSyncError(RuntimeError):
    """The SGLang servers did not take a step's weights; the message names server and path."""


def server_sampler(spec: str) -> Sampler:
    """The SGLang sampler of ``spec`` (``sglang+http://...``), once every server is healthy.

    Checked before the first step: a wrong URL or a server still loading would otherwise turn
    the first rollout into error generations (stored, but nothing to train on) and surface
    only at the first weight push. The spec's ``?tokenizer=`` is not used: prompts are rendered
    with the trained model's tokenizer, the one in every checkpoint pushed to the servers.
    """

    sampler = make_sampler(resolve(spec))
    assert isinstance(sampler, SGLangSampler)  # resolve() gives an sglang spec for sglang+...
    down = [url for url, ok in sampler.health().items() if not ok]
    if down:
        sampler.close()
        raise SamplerError(
            f"sampler {spec!r}: no healthy SGLang server at {', '.join(down)} (GET /health). "
            "Start them on the checkpoint you train (python -m sglang.launch_server "
            "--model-path DIR --port PORT), wait until /health answers 200, or fix `sampler`"
        )
    return sampler


def _push_weights(
    source: WeightSource, receiver: WeightReceiver, run_dir: Path, step: int
) -> str | None:
    """Write, push, then prune older copies (rank 0); the error message if anything failed."""

    root = run_dir / WEIGHTS
    try:
        path = _write_weights(source, root, step)
    except OSError as exc:
        return f"step {step}: could not write the weights for SGLang under {root}: {exc!r}"
    try:
        receiver.update_weights_from_disk(path, weight_version=str(step))
    except SamplerError as exc:
        return (
            f"step {step}: the SGLang servers did not load the new weights, so training "
            f"stopped (further rollouts would come from stale weights). {exc}. The path must "
            "be readable by every server at the same location (a shared filesystem); fix the "
            f"server and resume the run ({run_dir}) from its newest checkpoint"
        )
    _prune_weights(root, keep=path.name)
    return None


def _push_adapter(peft: Any, receiver: AdapterReceiver, run_dir: Path, step: int) -> str | None:
    """Write the adapter, load it on every server under a new name, switch the requests to it,
    drop the previous one and older copies (rank 0); the error message if anything failed."""

    root = run_dir / WEIGHTS
    try:
        final = _write_atomically(
            root / f"adapter-{step:06d}", lambda tmp: adapters.save(peft, tmp)
        )
    except OSError as exc:
        return f"step {step}: could not write the adapter for SGLang under {root}: {exc!r}"
    # a name never used before on these servers, also when a resumed run pushes a step again
    name = f"{run_dir.name}-step{step}-{uuid.uuid4().hex[:6]}"
    previous = receiver.lora_name
    try:
        receiver.load_lora_adapter(name, final)
        receiver.use_lora_adapter(name)
        if previous is not None:
            receiver.unload_lora_adapter(previous)
    except SamplerError as exc:
        return (
            f"step {step}: the SGLang servers did not take the new adapter, so training stopped "
            f"(further rollouts would come from a stale policy). {exc}. Start the servers with "
            "--enable-lora --max-lora-rank R --lora-target-modules M (R and M at least the "
            f"run's [lora] rank and target_modules); the path must be readable by every server "
            f"at the same location; then resume the run ({run_dir})"
        )
    _prune_weights(root, keep=final.name)
    return None


def _write_weights(source: WeightSource, root: Path, step: int) -> Path:
    """``root/step-N`` as a Hugging Face checkpoint, written to a temporary and renamed.

    The rename means a server is never pointed at, and a crash never leaves, half a copy
    under the final name.
    """

    def write(tmp: Path) -> None:
        source.model.save_pretrained(tmp, safe_serialization=True)
        source.tokenizer.save_pretrained(tmp)

    return _write_atomically(root / f"step-{step:06d}", write)


def _write_atomically(final: Path, write: Callable[[Path], None]) -> Path:
    """``write`` into a temporary sibling of ``final``, then rename it to ``final`` (a copy of
    the same step pushed again, by a resumed run, is replaced whole)."""
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    return final


def _prune_weights(root: Path, keep: str) -> None:
    """Delete every pushed copy (and leftover temporary) under ``root`` except ``keep``.

    Without this a run keeps one full copy per step (30 steps of a 135M model: 16 GB).
    """
    for entry in root.iterdir():
        ours = entry.name.startswith(("step-", ".step-", "adapter-", ".adapter-"))
        if ours and entry.name != keep and entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)  # a leftover is retried at the next push
