"""LoRA adapters (``envace_engine.adapters``): the trained model, the merged sampling copy,
checkpoints that resume, adapter directories that load, and the errors for bad input."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from envace_engine import adapters
from envace_engine.config import ConfigError, LoraSettings, TrainConfig, build
from envace_engine.logprobs import completion_logprobs
from envace_engine.models import ModelError, load_model, resolve
from envace_engine.samplers.base import SamplingParams
from envace_engine.samplers.embedded.sampler import HFSampler
from envace_engine.training.checkpoint import restore
from envace_engine.training.lora import trained_model
from envace_engine.training.loss import LossInputs, policy_loss

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "train_job.py"
SMALL = LoraSettings(enabled=True, rank=4, alpha=8)


def _nonzero_b(peft: torch.nn.Module, seed: int = 0) -> None:
    """A fresh adapter has B = 0 (the model unchanged): give B values so the tests can fail."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    ids = torch.randint(0, 2000, (3, 14), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros_like(ids)
    mask[:, 7:] = 1
    return ids, torch.ones_like(ids), mask


def _loss(model: torch.nn.Module, ids: torch.Tensor, att: torch.Tensor, cm: torch.Tensor) -> Any:
    logprobs = completion_logprobs(model, ids, att, cm)
    inputs = LossInputs(
        logprobs=logprobs,
        old_logprobs=logprobs.detach() - 0.05,  # off-policy enough that the clip matters
        advantages=torch.tensor([1.0, -0.5, 0.25]),
        mask=cm.float(),
        role_ids=torch.tensor([0, 1, 0]),
    )
    return logprobs, policy_loss(inputs).loss


def test_lora_model_equals_its_merged_weights_in_the_loss() -> None:
    model, merged = trained_model(resolve("tiny"), SMALL)
    _nonzero_b(model)
    adapters.refresh(model, merged)
    ids, att, cm = _batch()
    lp_lora, loss_lora = _loss(model, ids, att, cm)
    merged.requires_grad_(True)
    lp_full, loss_full = _loss(merged, ids, att, cm)
    assert torch.allclose(lp_lora, lp_full, atol=1e-5)
    assert torch.allclose(loss_lora, loss_full, atol=1e-6)
    # the adapter's gradient is the full gradient seen through it: dL/dB = s · dL/dW · Aᵀ
    loss_lora.backward()
    loss_full.backward()
    name, layer = next(iter(adapters.lora_layers(model).items()))
    a = layer.lora_A[adapters.NAME].weight
    full_grad = merged.get_submodule(name).weight.grad
    want = layer.scaling[adapters.NAME] * full_grad @ a.T
    assert torch.allclose(layer.lora_B[adapters.NAME].weight.grad, want, atol=1e-6)


def test_the_sampler_reads_the_merged_copy_after_each_step() -> None:
    model, merged = trained_model(resolve("tiny"), SMALL)
    sampler = HFSampler(merged, _tokenizer(), batch_size=4, dtype="float32")
    ids, att, cm = _batch()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # B moves away from 0, so a stale copy would differ
        _, loss = _loss(model, ids, att, cm)
        optimizer.zero_grad()
        (loss - 1.0).backward()
        optimizer.step()
    adapters.refresh(model, merged)
    prompt = ids[0, :7].tolist()
    gen = sampler.generate([prompt], SamplingParams(max_new_tokens=6, temperature=1.0, seed=3))[0]
    full = torch.tensor([prompt + list(gen.token_ids)])
    mask = torch.zeros_like(full)
    mask[0, len(prompt) :] = 1
    with torch.no_grad():
        trainer_lp = completion_logprobs(model, full, torch.ones_like(full), mask)[0, len(prompt) :]
    # fp32 sampler: the same weights, only the summation order differs
    assert torch.allclose(trainer_lp, torch.tensor(gen.logprobs), atol=1e-4)


def _tokenizer() -> Any:
    from envace_engine.models import load_tokenizer

    return load_tokenizer(resolve("tiny"))


def test_an_adapter_dir_resolves_onto_its_recorded_base(tmp_path: Path) -> None:
    model, merged = trained_model(resolve("tiny"), SMALL)
    _nonzero_b(model)
    adapters.refresh(model, merged)
    adapters.save(model, tmp_path / "adapter")
    assert adapters.recorded_base(tmp_path / "adapter") == "tiny"  # a name, not a local path
    ids, att, cm = _batch()
    want = completion_logprobs(merged, ids, att, cm)
    for name in (str(tmp_path / "adapter"), f"tiny+{tmp_path / 'adapter'}"):
        spec = resolve(name)
        assert spec.adapter == tmp_path / "adapter" and spec.base_name == "tiny"
        got = completion_logprobs(load_model(spec), ids, att, cm)
        assert torch.allclose(got, want, atol=1e-5)
    # training on from it continues the same adapter
    again, _ = trained_model(resolve(str(tmp_path / "adapter")), SMALL)
    assert torch.allclose(completion_logprobs(again, ids, att, cm), want, atol=1e-5)
    # full fine-tuning from it trains every merged weight (peft's loader had frozen them)
    full, _ = trained_model(resolve(str(tmp_path / "adapter")), LoraSettings())
    assert all(p.requires_grad for p in full.parameters())


def test_bad_lora_settings_and_adapters_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lora\.rank"):
        build(TrainConfig, {"lora": {"enabled": True, "rank": 0}})
    with pytest.raises(adapters.AdapterError, match=r"'qkv' is not a linear layer"):
        trained_model(resolve("tiny"), LoraSettings(enabled=True, target_modules=("qkv",)))
    model, _ = trained_model(resolve("tiny"), SMALL)
    adapters.save(model, tmp_path / "adapter")
    with pytest.raises(ModelError, match=r"does not fit this base model.*trained on 'tiny'"):
        load_model(resolve(f"smollm2-135m+{tmp_path / 'adapter'}"))
    with pytest.raises(adapters.AdapterError, match=r"has rank 4.*asks rank 8"):
        trained_model(resolve(str(tmp_path / "adapter")), LoraSettings(enabled=True, rank=8))
    (tmp_path / "plain").mkdir()
    with pytest.raises(ModelError, match="not a LoRA adapter"):
        resolve(f"tiny+{tmp_path / 'plain'}")


def test_a_full_checkpoint_does_not_resume_a_lora_run(tmp_path: Path, tiny_path: Path) -> None:
    model, _ = trained_model(resolve("tiny"), SMALL)
    (tmp_path / "state.json").write_text('{"step": 1, "data_position": 2, "config": {}}')
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    with pytest.raises(ValueError, match="holds full weights but this run trains a LoRA"):
        restore(tmp_path, model, optimizer)


def _job(run_dir: Path, steps: int, *args: str) -> list[str]:
    # fp32 sampler and one thread (OMP_NUM_THREADS=1): two processes' last bits of a bf16 GEMM or
    # a threaded reduction can differ (seen with LoRA's second model in memory); these cannot
    lora = [
        "lora.enabled=true",
        "lora.rank=4",
        "checkpoint_every=1",
        "rollout.sampler_dtype=float32",
    ]
    return [sys.executable, str(JOB), str(run_dir), f"steps={steps}", *lora, *args]


@pytest.mark.slow
def test_resume_from_an_adapter_checkpoint_gives_the_same_next_step(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    subprocess.run(_job(tmp_path / "straight", 3), check=True, timeout=600, env=env)
    subprocess.run(_job(tmp_path / "split", 2), check=True, timeout=600, env=env)
    subprocess.run(_job(tmp_path / "split", 3, "--resume"), check=True, timeout=600, env=env)
    want = (tmp_path / "straight" / "params.sha256").read_text()
    assert (tmp_path / "split" / "params.sha256").read_text() == want
    assert (tmp_path / "straight" / "params.initial.sha256").read_text() != want  # it trained
    saved = tmp_path / "straight" / "checkpoints" / "step-000003"
    assert adapters.is_adapter_dir(saved) and not (saved / "model.safetensors").exists()


@pytest.mark.slow
def test_sft_under_lora_saves_an_adapter_that_loads(tmp_path: Path) -> None:
    from envace_engine.sink import JsonlSink
    from envace_engine.training.sft import run_sft
    from tests.test_sft import tiny_sft_config

    config = tiny_sft_config(lr=1e-2, lora={"enabled": True, "rank": 4})
    out = run_sft(config, tmp_path / "model", JsonlSink(tmp_path))
    assert adapters.is_adapter_dir(out) and not (out / "model.safetensors").exists()
    assert (out / "envace_prompts.json").is_file()  # evaluations render prompts as SFT did
    ids, att, cm = _batch()
    base = completion_logprobs(load_model(resolve("tiny")), ids, att, cm)
    tuned = completion_logprobs(load_model(resolve(str(out))), ids, att, cm)
    assert not torch.allclose(base, tuned)  # the adapter learned something and is applied


def test_envace_eval_takes_base_plus_adapter(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from envace_engine.cli import app
    from storage.layout import read_manifest

    model, _ = trained_model(resolve("tiny"), SMALL)
    adapters.save(model, tmp_path / "adapter")
    name = f"tiny+{tmp_path / 'adapter'}"
    run = tmp_path / "runs" / "eval-adapter"
    args = ["eval", "--model", name, "--suite", "toy", "--n-tasks", "1", "--examples", "0"]
    args += ["--max-new-tokens-act", "6", "--max-turns", "1", "--run-dir", str(run)]
    result = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(app, args)
    assert result.exit_code == 0, result.output
    assert read_manifest(run).model == name  # the run names base and adapter


def test_the_studio_forms_accept_an_adapter_as_a_model(tmp_path: Path) -> None:
    from envace_engine.models import is_local_model
    from studio.forms import known_model

    (tmp_path / "adapter").mkdir()
    (tmp_path / "adapter" / adapters.ADAPTER_CONFIG).write_text('{"r": 4}')
    for name in (str(tmp_path / "adapter"), f"tiny+{tmp_path / 'adapter'}"):
        assert is_local_model(name) and known_model(name) == name
    assert not is_local_model(f"tiny+{tmp_path}")  # not an adapter folder
    with pytest.raises(ValueError, match="LoRA adapter folder"):
        known_model(str(tmp_path / "missing"))
