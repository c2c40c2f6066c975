"""Foundation: package layout, the studio's import weight, the CLI and the model registry."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from envace_engine.models import ModelError, resolve

# the packages of the ``train`` extra, which the browsing install (plain ``pip install``) lacks
TRAIN_EXTRA = ("torch", "transformers", "trl", "accelerate", "datasets", "safetensors", "gguf")


def test_the_studio_builds_and_the_cli_starts_without_the_train_extra(tmp_path):
    code = (
        "import sys\n"
        f"for m in {TRAIN_EXTRA!r}: sys.modules[m] = None  # import fails, as if not installed\n"
        "import studio.app\n"
        f"studio.app.build_app({str(tmp_path)!r})\n"
        "from typer.testing import CliRunner\n"
        "from envace_engine.cli import app\n"
        "result = CliRunner().invoke(app, ['studio', '--help'])\n"
        "assert result.exit_code == 0, result.output\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_cli_help_lists_commands():
    out = subprocess.run(
        [sys.executable, "-m", "envace_engine.cli", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for command in ("studio", "models"):
        assert command in out


def test_resolve_sglang_spec():
    spec = resolve("sglang+http://127.0.0.1:30000,127.0.0.1:30001?tokenizer=tiny")
    assert spec.kind == "sglang"
    assert spec.urls == ("http://127.0.0.1:30000", "http://127.0.0.1:30001")
    assert spec.tokenizer == "tiny"


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("no-such-model", "unknown model 'no-such-model'"),
        ("sglang+ftp://x:1", "expected sglang+http://HOST:PORT"),
        ("sglang+http://hostonly", "needs a port"),
    ],
)
def test_resolve_rejects_bad_names(name, needle):
    with pytest.raises(ModelError, match=re.escape(needle)):
        resolve(name)


def test_tiny_model_generates(tiny_model, tokenizer):
    import torch

    ids = torch.tensor([tokenizer.encode("hello world")])
    out = tiny_model.generate(ids, max_new_tokens=4, do_sample=False, pad_token_id=2)
    assert out.shape == (1, ids.shape[1] + 4)
    assert tiny_model.config.num_hidden_layers == 4


@pytest.mark.slow
def test_smollm2_smoke_cli():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "envace_engine.cli",
            "models",
            "smoke",
            "smollm2-135m",
            "--max-new-tokens",
            "12",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Paris" in out
    assert "tok/s" in out


@pytest.mark.slow
def test_smollm2_checkpoint_is_clean():
    from transformers import AutoModelForCausalLM

    spec = resolve("smollm2-135m")
    model = AutoModelForCausalLM.from_pretrained(spec.path)
    assert getattr(model.config, "quantization_config", None) is None
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(134.5e6, rel=0.01)


def _hub_cache(cache, repo_id: str, source) -> None:
    """A Hugging Face Hub cache entry for ``repo_id`` holding ``source``'s files (the layout
    huggingface_hub writes: refs/main names a commit, snapshots/<commit>/ holds the files)."""
    import shutil

    commit = "0" * 40
    entry = cache / f"models--{repo_id.replace('/', '--')}"
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text(commit)
    shutil.copytree(source, entry / "snapshots" / commit)


def test_a_hub_id_resolves_from_the_cache_and_names_itself_when_offline(
    tiny_path, tmp_path, monkeypatch
):
    from envace_engine.models import load_model, load_tokenizer

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    _hub_cache(tmp_path, "test-org/tiny-llama", tiny_path)
    spec = resolve("test-org/tiny-llama")
    assert spec.kind == "hf" and spec.path is not None and (spec.path / "config.json").is_file()
    assert load_model(spec).config.num_hidden_layers == 4
    assert load_tokenizer(spec).eos_token is not None
    with pytest.raises(ModelError, match=r"'HuggingFaceTB/SmolLM2-1.7B'.*offline.*HF_HUB_OFFLINE"):
        resolve("HuggingFaceTB/SmolLM2-1.7B")
