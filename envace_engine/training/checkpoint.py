"""Training checkpoints: everything needed to continue a run exactly, written atomically.

A checkpoint is a directory ``<run>/checkpoints/step-000012/`` holding

* the model as a Hugging Face checkpoint (``config.json``, ``model.safetensors``, tokenizer
  files), so ``model = "<that dir>"`` starts a new run or an evaluation from it; under
  ``[lora]``, the adapter alone (``adapter_config.json``, ``adapter_model.safetensors``), which
  ``model = "<that dir>"`` loads onto the base its config names (``envace_engine.adapters``);
* ``trainer_state.pt``: the optimizer state and the RNG states of python, numpy and torch;
* ``envace_prompts.json``: the prompt settings the run trained with (``config.PROMPT_KEYS``);
* ``state.json``: the step, the data position (how many tasks have been drawn from the seeded
  task order) and the config the run was started with.

It is written to a temporary sibling and renamed, so a ``kill -9`` at any moment leaves either
the whole checkpoint or none of it; ``latest`` only ever sees complete ones. Weights are stored
in fp32 safetensors and the optimizer state with ``torch.save``, so a resumed run continues from
bit-identical state.

The format does not depend on the distributed strategy: FSDP runs gather full weights and a
full, plain ``optimizer.state_dict()`` before rank 0 writes, and cut them back into shards on
restore (``training.parallel.fsdp``), so a checkpoint of either strategy resumes with either.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envace_engine import adapters
from envace_engine.config import RolloutSettings, write_prompt_settings

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CHECKPOINTS = "checkpoints"
STATE_FILE = "state.json"
TRAINER_FILE = "trainer_state.pt"
_NAME = re.compile(r"^step-(\d{6})$")


@dataclass(frozen=True)
class TrainState:
    """Where a run is: ``step`` optimizer steps done, ``data_position`` tasks drawn."""

    step: int
    data_position: int
    config: dict[str, Any]


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """``<run_dir>/checkpoints/step-000012``."""
    return Path(run_dir) / CHECKPOINTS / f"step-{step:06d}"


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (temporaries are never listed)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if _NAME.match(p.name) and (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def rng_state() -> dict[str, Any]:
    """The RNG states of python, numpy and torch (CPU, and CUDA when present)."""
    import numpy as np
    import torch

    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    import numpy as np
    import torch

    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(
    run_dir: Path,
    state: TrainState,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    keep: int = 2,
    optimizer_state: Mapping[str, Any] | None = None,
    prompts: RolloutSettings | None = None,
) -> Path:
    """Write checkpoint ``state.step`` atomically; prune all but the newest ``keep``.

    ``optimizer_state``: a full ``state_dict()`` gathered from sharded training (FSDP,
    ``fsdp.full_optimizer_state``) to store instead of ``optimizer.state_dict()``, whose
    tensors would be this rank's shards only. Either way the file has one format.
    ``prompts``: the run's rollout settings, recorded so evaluations render prompts as training
    did (``config.write_prompt_settings``).
    """
    import torch

    final = checkpoint_dir(run_dir, state.step)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if adapters.is_peft(model):  # the adapter alone; its tokenizer is its base model's
        adapters.save(model, tmp)
    else:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
    if prompts is not None:
        write_prompt_settings(tmp, prompts)
    optim = optimizer_state if optimizer_state is not None else optimizer.state_dict()
    trainer = {"optimizer": optim, "rng": rng_state()}
    torch.save(trainer, tmp / TRAINER_FILE)
    body = {"step": state.step, "data_position": state.data_position, "config": state.config}
    (tmp / STATE_FILE).write_text(json.dumps(body, indent=1), encoding="utf-8")
    _fsync_dir(tmp)
    if final.exists():  # the same step saved again (a resumed run): replace it whole
        shutil.rmtree(final)
    tmp.rename(final)
    _fsync_dir(final.parent)
    for old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def read_state(path: Path) -> TrainState:
    """The ``state.json`` of checkpoint ``path``."""
    file = Path(path) / STATE_FILE
    if not file.is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {STATE_FILE})")
    body = json.loads(file.read_text(encoding="utf-8"))
    return TrainState(int(body["step"]), int(body["data_position"]), dict(body["config"]))


def restore(
    path: Path,
    model: PreTrainedModel,
    optimizer: torch.optim.Optimizer,
    sharded: Any | None = None,
) -> TrainState:
    """Load weights, optimizer and RNG states from checkpoint ``path`` into live objects.

    ``sharded`` (FSDP, ``fsdp.LogprobModule``): ``model`` is the full copy and ``optimizer``
    trains the shards; each rank cuts the full weights and optimizer state (saved by any
    strategy) into its own shards, so a run resumes with either strategy.
    """
    import torch
    from safetensors.torch import load_file

    state = read_state(path)
    if adapters.is_adapter_dir(path) != adapters.is_peft(model):
        kinds = ("a LoRA adapter", "full weights")
        saved, live = kinds if adapters.is_adapter_dir(path) else kinds[::-1]
        raise ValueError(
            f"{path} holds {saved} but this run trains {live}: resume with the run's own "
            "[lora] settings"
        )
    if adapters.is_peft(model):
        adapters.load_weights(model, Path(path))
        missing, unexpected = [], []
    else:
        weights = load_file(str(Path(path) / "model.safetensors"))
        missing, unexpected = model.load_state_dict(weights, strict=False)
    # Tied weights (lm_head = embeddings) are saved once; anything else missing is an error.
    missing = [k for k in missing if k not in _tied_keys(model)]
    if missing or unexpected:
        raise ValueError(
            f"{path}: weights do not fit the model (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}): resume with the run's own model"
        )
    trainer = torch.load(Path(path) / TRAINER_FILE, weights_only=False)
    optim = trainer["optimizer"]
    if sharded is not None:
        from envace_engine.training.parallel import fsdp

        fsdp.load_weights(sharded, model)
        optim = fsdp.shard_optimizer_state(optim, optimizer)
    optimizer.load_state_dict(optim)
    set_rng_state(trainer["rng"])
    return state


def _tied_keys(model: Any) -> set[str]:
    tied = getattr(model, "_tied_weights_keys", None) or {}
    return set(tied if not isinstance(tied, dict) else tied.keys())


def _fsync_dir(path: Path) -> None:
    """Flush a directory's entries so a rename survives a power cut, not just a kill."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
