"""Hosting on a Hugging Face Space: where data lives, who may write, what a job may use.

A Space is recognised by ``$SPACE_ID`` (set by Hugging Face). There:

* **data** goes to ``/data/envace`` when persistent storage is mounted at ``/data`` (and
  writable), else to ``~/envace-runs`` on the ephemeral disk, where the bundled demo is copied
  in at start (``studio.demo``); ``$ENVACE_HOME`` overrides both.
* **writers**: anyone may browse; only the Space's owner (``$SPACE_AUTHOR_NAME``) and the users
  in ``$ENVACE_WRITERS`` (comma-separated; ``*`` = every signed-in user, for a Space that limits
  sign-in to an organisation with ``hf_oauth_authorized_org``) may launch, cancel, resume,
  annotate or save budgets (``studio.auth``).
* **limits**: one job at a time (``$ENVACE_MAX_JOBS``, default 1) and a cap on the local model a
  job may load (``$ENVACE_MAX_MODEL_PARAMS``, default 500 M parameters: SmolLM2-135M and its
  checkpoints fit, a 1.7B model does not), refused with a message saying so.

Everything the Space needs is installed when its image is built (``Dockerfile``,
``scripts/space_install.sh``): nothing here calls pip.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path

PERSISTENT = Path("/data")
DEFAULT_MAX_MODEL_PARAMS = 500_000_000
# parameters of the registry's models (``envace_engine.models.registry``), so a cap can be
# checked without loading one
REGISTRY_PARAMS = {"smollm2-135m": 134_515_008, "tiny": 3_300_000}


class LimitError(ValueError):
    """A request goes beyond what this host allows; the message says which limit."""


def on_space() -> bool:
    """Whether this process runs on a Hugging Face Space."""
    return bool(os.environ.get("SPACE_ID"))


def data_root(persistent: Path = PERSISTENT) -> Path:
    """The studio data folder on a Space (see module doc)."""
    if os.environ.get("ENVACE_HOME"):
        return Path(os.environ["ENVACE_HOME"])
    if persistent.is_dir() and os.access(persistent, os.W_OK):
        return persistent / "envace"
    return Path.home() / "envace-runs"


def writers() -> frozenset[str]:
    """Who may write on this Space: its owner and ``$ENVACE_WRITERS`` (``*``: everyone)."""
    names = {os.environ.get("SPACE_AUTHOR_NAME", "")}
    names |= {n.strip() for n in os.environ.get("ENVACE_WRITERS", "").split(",")}
    return frozenset(n for n in names if n)


@dataclass(frozen=True)
class HostLimits:
    """What one job may use on this host (``None``: no limit, as on a researcher's machine)."""

    max_jobs: int | None = None
    max_model_params: int | None = None

    @classmethod
    def for_space(cls) -> HostLimits:
        """The Space's limits, from the environment (module doc)."""
        return cls(
            max_jobs=int(os.environ.get("ENVACE_MAX_JOBS", "1")),
            max_model_params=int(
                os.environ.get("ENVACE_MAX_MODEL_PARAMS", str(DEFAULT_MAX_MODEL_PARAMS))
            ),
        )

    def check_model(self, model: str) -> None:
        """Raise ``LimitError`` when ``model`` is over the parameter cap (or cannot be sized)."""
        if self.max_model_params is None:
            return
        if model.startswith(("sglang+", "openai+")):
            raise LimitError(
                f"model {model!r}: this Space runs jobs on its own CPU only, not on remote servers"
            )
        params = REGISTRY_PARAMS.get(model)
        if params is None:
            params = checkpoint_params(Path(model).expanduser())
        if params > self.max_model_params:
            raise LimitError(
                f"model {model!r} has {params / 1e6:.0f} M parameters; this Space allows at most "
                f"{self.max_model_params / 1e6:.0f} M (ENVACE_MAX_MODEL_PARAMS)"
            )


def checkpoint_params(folder: Path) -> int:
    """Parameters stored in a checkpoint's ``*.safetensors`` files, read from their headers
    (8-byte little-endian length, then JSON with each tensor's shape): no torch, no loading."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise LimitError(f"{folder}: no .safetensors weights to size the model by")
    total = 0
    for path in files:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        for name, entry in header.items():
            if name != "__metadata__":
                count = 1
                for dim in entry["shape"]:
                    count *= dim
                total += count
    return total
