"""Shared fixtures. Tests never touch the network: hub access is off, analytics off."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest


@pytest.fixture(scope="session")
def tiny_path():
    """Directory of the seeded tiny Llama (built once per machine under the model cache)."""
    from envace_engine.models import ensure_tiny

    return ensure_tiny()


@pytest.fixture(scope="session")
def tokenizer(tiny_path):
    """The SmolLM2 tokenizer (shared by ``tiny`` and ``smollm2-135m``)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_path)


@pytest.fixture(scope="session")
def tiny_model(tiny_path):
    """The tiny model in eval mode, fp32 (session-scoped: do not train it in place)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_path).eval()
