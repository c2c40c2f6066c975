"""SFT from the MCP example's reference trajectories: the reference calls and their recorded
results become act and rehearse examples, and a tiny SFT run trains on them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from envace_engine.config import SFTConfig, build
from envace_engine.environments import get_suite
from envace_engine.sink import JsonlSink
from envace_engine.training.sft import all_samples, run_sft
from tests.mcp_helpers import EXAMPLE_SUITE

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]


def _config(**extra: object) -> SFTConfig:
    data: dict = {
        "model": "tiny",
        "suite": EXAMPLE_SUITE,
        "n_tasks": 4,
        "max_steps": 2,
        "batch_size": 2,
        "roles": ["act", "rehearse"],
        "rollout": {"n_examples": 0},
    }
    return build(SFTConfig, {**data, **extra})


def test_reference_calls_give_act_and_rehearse_examples() -> None:
    suite = get_suite(EXAMPLE_SUITE)
    samples = all_samples(_config(), suite)
    assert {s.role for s in samples} == {"act", "rehearse"}
    tasks = {t.id: t for t in suite.tasks("train")}
    for sample in (s for s in samples if s.role == "rehearse"):
        # the target is the server's recorded answer to one of the task's reference calls
        body = sample.target.removeprefix("<execution_result>").removesuffix("</execution_result>")
        recorded = [r for turn in tasks[sample.source].reference_results for r in turn]
        assert json.loads(body) in recorded, sample.source


def test_a_tiny_sft_run_trains_on_them(tmp_path: Path) -> None:
    out = run_sft(_config(), tmp_path / "model", JsonlSink(tmp_path))
    assert (out / "config.json").is_file()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [m["sft/loss"] for m in lines if "sft/loss" in m]
    assert len(losses) >= 2 and all(math.isfinite(x) for x in losses)
