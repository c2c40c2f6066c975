"""A LoRA run on SGLang servers pushes only its adapter (``weight_sync._push_adapter``), checked
against the loopback stand-in, which refuses what a real server refuses."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from envace_engine import adapters
from envace_engine.config import TrainConfig, load
from envace_engine.sink import JsonlSink
from envace_engine.training import trainer
from envace_engine.training.parallel import weight_sync
from tests.sglang_server import running_server
from tests.test_trainer_sglang import CONFIGS, sglang_spec
from tests.train_job import even_token_share

LORA = ["lora.enabled=true", "lora.rank=4", "lora.alpha=8", "steps=2"]


def _parts(servers: list, *overrides: str) -> trainer.Parts:
    sets = [f'sampler="{sglang_spec(servers)}"', *LORA, *overrides]
    parts = trainer.setup(load(TrainConfig, CONFIGS / "tiny-test.toml", sets))
    return dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)


def test_a_lora_run_sends_the_adapter_and_names_it_in_every_request(
    tiny_path: Path, tmp_path: Path
) -> None:
    with (
        running_server(tiny_path, enable_lora=True) as one,
        running_server(tiny_path, enable_lora=True) as two,
    ):
        parts = _parts([one, two])
        trainer.run(parts, tmp_path, JsonlSink(tmp_path))
        # no full checkpoint was ever written for the servers, one adapter copy is left
        assert sorted(p.name for p in (tmp_path / weight_sync.WEIGHTS).iterdir()) == [
            "adapter-000002"
        ]
        assert all(s.weight_version == "default" for s in (one, two))  # base never replaced
        for server in (one, two):
            named = [n for names in server.lora_paths for n in names]
            assert named and None not in named  # every prompt asked for the run's adapter
            assert len(set(named)) == 2  # step 0's and step 1's adapter, in that order
            assert list(server.loras) == [parts.sampler.lora_name]  # older ones unloaded
            served = server.loras[parts.sampler.lora_name].model.state_dict()
            for name, tensor in parts.merged.state_dict().items():
                assert torch.allclose(served[name], tensor, atol=1e-6), name


def test_the_adapter_bytes_are_a_small_share_of_the_weights(tiny_path: Path) -> None:
    with running_server(tiny_path, enable_lora=True) as one:
        parts = _parts([one])
        full = sum(p.numel() * p.element_size() for p in parts.merged.parameters())
        assert 0 < adapters.adapter_bytes(parts.model) < full / 10


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        ({"enable_lora": False}, "--enable-lora"),
        ({"enable_lora": True, "max_lora_rank": 2}, "--max-lora-rank"),
        ({"enable_lora": True, "lora_target_modules": ("q_proj", "v_proj")}, "target"),
    ],
)
def test_a_server_that_cannot_serve_the_adapter_stops_training_with_how_to_start_it(
    tiny_path: Path, tmp_path: Path, flags: dict, says: str
) -> None:
    with running_server(tiny_path, **flags) as one:
        parts = _parts([one])
        with pytest.raises(weight_sync.WeightSyncError, match=says) as err:
            trainer.run(parts, tmp_path, JsonlSink(tmp_path))
        assert "--enable-lora --max-lora-rank" in str(err.value)  # how to start the servers


def test_a_request_for_an_adapter_that_is_not_loaded_is_an_error_generation(
    tiny_path: Path,
) -> None:
    from envace_engine.samplers.base import SamplingParams
    from envace_engine.samplers.sglang import SGLangSampler

    with running_server(tiny_path, enable_lora=True) as one:
        sampler = SGLangSampler(one.url)
        sampler.use_lora_adapter("never-loaded")
        gen = sampler.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))[0]
        assert gen.finish_reason == "error" and "not loaded" in gen.error
