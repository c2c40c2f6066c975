"""LoRA adapters (peft): attach one for training, merge one for sampling, save one small.

An adapter directory is peft's format (``adapter_config.json``, ``adapter_model.safetensors``)
and its ``adapter_config.json`` names the base model by the name it was trained from (a
registry name such as ``smollm2-135m``, a Hub id or a checkpoint directory), never by a path
that exists on one machine only, so ``model = "<adapter dir>"`` resolves wherever that base
does. ``BASE+ADAPTER_DIR`` names the base explicitly (``models.resolve``).

Sampling reads a *merged copy*: a plain model of the same architecture whose adapted weights
are ``W + (alpha/r)·B·A``, rewritten in place after every optimizer step (``refresh``). Its
forward is the base model's, so the embedded sampler's packed weights and compact decode step
apply unchanged, and a step costs one small GEMM per adapted layer instead of two extra GEMMs
per layer in every decode step. Merging into the trained model itself (peft's
``merge_adapter``/``unmerge_adapter``) would add and subtract the update from the frozen base
each step, and its rounding would drift the base over a run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from envace_engine.config import LoraSettings

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
NAME = "default"  # peft's adapter name: one adapter per model


class AdapterError(ValueError):
    """An adapter does not fit its settings or its base model; the message says what to fix."""


def split_name(name: str) -> tuple[str, Path]:
    """``BASE+ADAPTER_DIR`` -> (``BASE``, the folder); any other name -> ("", the name as a
    folder). Only a name's last ``+`` separates (``sglang+`` specs are resolved before this)."""
    base, plus, tail = name.rpartition("+")
    return (base, Path(tail).expanduser()) if plus else ("", Path(name).expanduser())


def is_adapter_dir(path: Path | str) -> bool:
    """Whether ``path`` holds a peft adapter (``adapter_config.json``)."""
    return (Path(path).expanduser() / ADAPTER_CONFIG).is_file()


def adapter_config(path: Path) -> dict[str, Any]:
    """The adapter's ``adapter_config.json``."""
    data = json.loads((Path(path) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise AdapterError(f"{path}/{ADAPTER_CONFIG} is not a JSON object: not a peft adapter")
    return data


def recorded_base(path: Path) -> str:
    """The base model an adapter was trained on, as its config names it."""
    base = adapter_config(path).get("base_model_name_or_path")
    if not base:
        raise AdapterError(
            f"adapter {path} does not name its base model (base_model_name_or_path): load it "
            "as BASE+ADAPTER_DIR, e.g. smollm2-135m+" + str(path)
        )
    return str(base)


def linear_names(model: Any) -> set[str]:
    """The last name part of every ``nn.Linear`` in ``model`` (what ``target_modules`` names)."""
    import torch

    return {
        name.rsplit(".", 1)[-1]
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    }


def check_targets(model: Any, targets: tuple[str, ...]) -> None:
    """Every target module must name a linear layer of ``model``."""
    found = linear_names(model)
    unknown = [t for t in targets if t not in found]
    if unknown:
        raise AdapterError(
            f"lora.target_modules: {', '.join(map(repr, unknown))} is not a linear layer of "
            f"this model; its linear layers are {', '.join(sorted(found))}"
        )


def attach(model: Any, settings: LoraSettings, base: str, start: Path | None = None) -> Any:
    """``model`` (a plain transformers model, frozen) with a trainable LoRA adapter.

    ``start``: an adapter directory to continue training (its rank and targets must match
    ``settings``); otherwise a fresh adapter (``B = 0``: the model's outputs are unchanged).
    ``base`` is the name written into the adapter's config.
    """
    from peft import LoraConfig, PeftModel, get_peft_model

    check_targets(model, settings.target_modules)
    if start is not None:
        _check_fits(start, settings.rank, settings.target_modules)
        peft = _load(lambda: PeftModel.from_pretrained(model, start, is_trainable=True), start)
    else:
        config = LoraConfig(
            r=settings.rank,
            lora_alpha=settings.alpha,
            lora_dropout=settings.dropout,
            target_modules=list(settings.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
        peft = get_peft_model(model, config)
    peft.peft_config[NAME].base_model_name_or_path = base
    return peft


def _check_fits(start: Path, rank: int, wanted: Any) -> None:
    """The adapter saved at ``start`` must have ``rank`` and the target modules ``wanted``."""
    found = adapter_config(start)
    targets = set(found.get("target_modules") or ())
    if found.get("r") != rank or targets != set(wanted):
        raise AdapterError(
            f"adapter {start} has rank {found.get('r')} on {sorted(targets)}, but [lora] asks "
            f"rank {rank} on {sorted(wanted)}: set lora.rank and lora.target_modules to the "
            "adapter's to continue it"
        )


def _load(make: Any, path: Path) -> Any:
    """Run a peft load, turning a shape mismatch into an error that names the adapter."""
    try:
        return make()
    except RuntimeError as err:
        if "size mismatch" not in str(err):
            raise
        base = recorded_base(path)
        raise AdapterError(
            f"adapter {path} does not fit this base model (it was trained on {base!r}; shapes "
            f"differ): load it onto that base, e.g. {base}+{path}"
        ) from None


def merged(model: Any, adapter: Path) -> Any:
    """A plain model: ``model`` with the adapter at ``adapter`` merged in, every weight
    trainable as a loaded checkpoint's are (peft loads for inference and freezes the base;
    full fine-tuning from an adapter checkpoint trains the merged weights)."""
    from peft import PeftModel

    peft = _load(lambda: PeftModel.from_pretrained(model, adapter), adapter)
    return peft.merge_and_unload().eval().requires_grad_(True)


def lora_layers(peft: Any) -> dict[str, Any]:
    """The adapted layers of a peft model, by their name in the plain base model."""
    from peft.tuners.lora import LoraLayer

    return {
        name: module
        for name, module in peft.get_base_model().named_modules()
        if isinstance(module, LoraLayer)
    }


def refresh(peft: Any, copy: Any) -> None:
    """Write ``W + (alpha/r)·B·A`` of every adapted layer of ``peft`` into ``copy`` in place.

    In place: the tensors' version counters move, so the embedded sampler repacks its weights
    and drops its prefix cache (``samplers.embedded``), as after a full fine-tuning step.
    """
    import torch

    with torch.no_grad():
        for name, layer in lora_layers(peft).items():
            weight = layer.base_layer.weight + layer.get_delta_weight(NAME)
            copy.get_submodule(name).weight.copy_(weight)


def is_peft(model: Any) -> bool:
    """Whether ``model`` is a peft model (a base under an adapter)."""
    return hasattr(model, "peft_config")


def load_weights(peft: Any, path: Path) -> None:
    """Load the adapter weights saved in ``path`` into ``peft`` (a resumed run)."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    config = peft.peft_config[NAME]
    _check_fits(path, config.r, config.target_modules)
    result = set_peft_model_state_dict(peft, load_file(str(Path(path) / ADAPTER_WEIGHTS)))
    unexpected = list(getattr(result, "unexpected_keys", []) or [])
    if unexpected:
        raise AdapterError(f"{path}: adapter weights {unexpected[:3]} do not fit this model")


def adapter_bytes(peft: Any) -> int:
    """Bytes of the adapter's weights as saved (what a push to a server sends)."""
    return sum(p.numel() * p.element_size() for p in peft.parameters() if p.requires_grad)


def save(peft: Any, out: Path) -> None:
    """Write the adapter (config and weights, no base weights) into directory ``out``."""
    # no embedding layers are adapted; "auto" would look the base up on the Hub to check
    peft.save_pretrained(out, safe_serialization=True, save_embedding_layers=False)
