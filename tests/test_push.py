"""``envace push``: a real tiny training run staged offline, then loaded back by transformers,
datasets and TRL's SFTTrainer, as a user of the pushed repos would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from envace_engine.cli.hub_stage import StageError, chat_messages

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> tuple[Path, str]:
    """A one-step tiny training run (episodes and a checkpoint) in a fresh data folder."""
    root = tmp_path_factory.mktemp("root")
    args = ["train", "--config", str(CONFIGS / "tiny-test.toml"), "--set", "steps=1"]
    result = CliRunner().invoke(app, [*args, "--set", f"root={root}", "--set", "run_id=t1"])
    assert result.exit_code == 0, result.output
    return root, "t1"


def _stage(root: Path, out: Path, *extra: str):
    args = ["push", "t1", "--root", str(root), "--stage", str(out), *extra]
    return CliRunner().invoke(app, args)


def test_the_staged_model_and_dataset_load_back(trained, tmp_path):
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    root, _ = trained
    result = _stage(
        root, tmp_path, "--repo", "me/tiny-envace", "--dataset", "me/eps", "--stage-only"
    )
    assert result.exit_code == 0, result.output
    model_dir, data_dir = tmp_path / "model", tmp_path / "dataset"
    assert not (model_dir / "trainer_state.pt").exists()  # resume state stays home
    card = (model_dir / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers") and "- me/eps" in card
    assert "# t1" in card and '"mode": "envace"' in card
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    ds = datasets.load_dataset(str(data_dir), split="train")
    episodes = json.loads((root / "runs" / "t1" / "progress.json").read_text())
    assert len(ds) == 4 and episodes["status"] == "done"  # 2 tasks x group 2, one step
    first = ds[0]["messages"]
    assert [m["role"] for m in first[:2]] == ["system", "user"]
    assert all(set(m) == {"role", "content"} for m in first)
    assert {"task_id", "reward", "stop_reason", "mode"} <= set(ds.column_names)
    config = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        max_steps=1,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="no",
        use_cpu=True,
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=ds, processing_class=tokenizer)
    assert trainer.train().global_step == 1


def test_push_errors_name_the_problem(trained, tmp_path):
    root, _ = trained
    result = _stage(root, tmp_path, "--stage-only")
    assert result.exit_code != 0 and "give --repo" in result.output
    result = CliRunner().invoke(app, ["push", "nope", "--root", str(root), "--repo", "me/x"])
    assert result.exit_code != 0 and "no run 'nope'" in result.output
    result = _stage(root, tmp_path, "--repo", "me/tiny-envace")  # HF_HUB_OFFLINE=1 in tests
    assert result.exit_code != 0 and "the Hub is offline" in result.output
    with pytest.raises(StageError, match="no ChatML markers"):
        chat_messages("plain text")


def test_a_lora_run_is_staged_as_an_adapter_repo_that_peft_loads(tmp_path):
    """A LoRA run pushes its adapter (a peft repo): peft puts it on the base model and gives
    the same logits as the merged model our loader builds. An SFT run makes the adapter: its
    loss moves ``B`` off zero on any CPU, so the comparison is not of the base with itself."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from envace_engine import adapters
    from envace_engine.models import load_model, resolve

    root = tmp_path / "root"
    sets = ["model=tiny", "n_tasks=4", "max_steps=2", "batch_size=2", "eval_tasks=2", "lr=1e-2"]
    sets += ["bf16=false", "lora.enabled=true", "lora.rank=4", f"root={root}", "run_id=l1"]
    args = ["sft", "--config", str(CONFIGS / "study-core-sft.toml")]
    result = CliRunner().invoke(app, [*args, *(x for s in sets for x in ("--set", s))])
    assert result.exit_code == 0, result.output
    stage = tmp_path / "stage"
    argv = ["push", "l1", "--root", str(root), "--stage", str(stage), "--stage-only"]
    result = CliRunner().invoke(app, [*argv, "--repo", "me/tiny-lora"])
    assert result.exit_code == 0, result.output
    model_dir = stage / "model"
    assert adapters.is_adapter_dir(model_dir) and not (model_dir / "model.safetensors").exists()
    card = (model_dir / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: peft") and "PeftModel.from_pretrained" in card
    base = resolve(adapters.recorded_base(model_dir))  # the base the adapter's config names
    plain = AutoModelForCausalLM.from_pretrained(base.path, dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(plain, str(model_dir))
    ours = load_model(resolve(str(model_dir)), dtype="float32")
    ids = torch.tensor([[1, 5, 9, 14, 3, 7]])
    with torch.no_grad():
        got, want = peft_model(ids).logits, ours(ids).logits
        untuned = load_model(base, dtype="float32")(ids).logits
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, untuned, atol=1e-4)  # the adapter is applied, not ignored
