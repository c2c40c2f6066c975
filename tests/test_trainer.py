"""The trainer: per-step metrics (hand-computed), mode filters, seeds, and a real 3-step run."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from envace_engine.config import TrainConfig, build, load
from envace_engine.training.metrics import (
    advantage_metrics,
    fidelity_metrics,
    reward_metrics,
    role_advantages,
)
from envace_engine.training.trainer import TRAINED, rollout_config, with_advantages
from envace_engine.types import (
    CallRecord,
    Episode,
    Mode,
    Role,
    ToolCall,
    ToolError,
    ToolResult,
    TrainRow,
)

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


def _episode(eid: str, reward: float | None, calls: tuple[CallRecord, ...] = ()) -> Episode:
    return Episode(
        id=eid,
        task_id="t",
        suite="toy",
        mode=Mode.REHEARSAL,
        group_id="g",
        segments=(),
        calls=calls,
        reward=reward,
    )


def _row(eid: str, role: Role, reward: float | None) -> TrainRow:
    return TrainRow(eid, "g", role, (1, 2), (3,), (-0.5,), reward)


def _call(shown: str, rehearsed: ToolResult | None, real: ToolResult | None) -> CallRecord:
    return CallRecord(0, 1, ToolCall("check_stock", {"item": "pens"}), shown, rehearsed, real)


def test_reward_metrics_by_hand() -> None:
    episodes = [_episode("e1", 1.0), _episode("e2", 0.0), _episode("e3", None)]
    rows = [
        _row("e1", Role.ACT, 1.0),
        _row("e1", Role.ACT, 1.0),
        _row("e1", Role.REHEARSE, 1.0),
        _row("e2", Role.ACT, 0.0),
        _row("e3", Role.ACT, None),
    ]
    m = reward_metrics(episodes, rows, {"e1": 1.0, "e2": 0.5})
    assert m["reward/mean"] == 0.5  # (1 + 0) / 2 scorable episodes
    assert m["reward/std"] == 0.5
    assert m["reward/unscorable"] == 1.0
    assert m["reward/act"] == pytest.approx(2 / 3)  # rows 1, 1, 0: long trajectories weigh more
    assert m["reward/rehearse"] == 1.0
    assert m["success/real"] == 0.75


def test_advantage_metrics_by_hand() -> None:
    rows = [_row("e1", Role.ACT, 1.0), _row("e2", Role.ACT, 0.0), _row("e1", Role.REHEARSE, 1.0)]
    m = advantage_metrics(rows, [0.5, -0.5, 0.0])
    assert (m["adv/act/mean"], m["adv/act/std"], m["adv/act/nonzero"]) == (0.0, 0.5, 1.0)
    assert (m["adv/rehearse/mean"], m["adv/rehearse/nonzero"]) == (0.0, 0.0)
    assert (m["rows/act/trained"], m["rows/rehearse/trained"]) == (2.0, 1.0)


def test_fidelity_metrics_by_hand() -> None:
    ok = ToolResult(value={"item": "pens", "qty": 3})
    err = ToolResult(error=ToolError("TOOL_EXECUTION_ERROR", "no such item"))
    episode = _episode(
        "e",
        1.0,
        (
            _call("rehearsed", ok, ok),  # exact: score 1
            _call("rehearsed", None, ok),  # unparseable rehearsal: fails every tier, score 0
            _call("rehearsed", ok, err),  # status disagrees: parse-valid, score 0
            _call("real", None, ok),  # real mode: no rehearsal, not a pair
        ),
    )
    m = fidelity_metrics([episode])
    assert m["fidelity/pairs"] == 3.0
    assert m["fidelity/score"] == pytest.approx(1 / 3)
    assert m["fidelity/exact"] == pytest.approx(1 / 3)
    assert m["fidelity/parse_valid"] == pytest.approx(2 / 3)
    assert m["fidelity/status_agree"] == pytest.approx(1 / 3)
    assert fidelity_metrics([_episode("x", 0.0)]) == {"fidelity/pairs": 0.0}


def test_role_advantage_means_go_to_episode_meta() -> None:
    rows = [_row("e1", Role.ACT, 1.0), _row("e1", Role.ACT, 1.0), _row("e1", Role.REHEARSE, 1.0)]
    assert role_advantages(rows, [0.25, 0.75, -1.0]) == {"e1": {"act": 0.5, "rehearse": -1.0}}
    out = with_advantages([_episode("e1", 1.0), _episode("e2", 0.0)], rows, [0.25, 0.75, -1.0])
    assert out[0].meta["advantages"] == {"act": 0.5, "rehearse": -1.0}
    assert out[1].meta["advantages"] == {}


def test_modes_train_the_right_roles() -> None:
    assert TRAINED["envace"] == (Role.ACT, Role.REHEARSE)
    assert TRAINED["real-grpo"] == (Role.ACT,)
    assert TRAINED["act-only"] == (Role.ACT,)
    assert rollout_config(build(TrainConfig, {"mode": "real-grpo"}), 0, 0).mode is Mode.REAL
    assert rollout_config(build(TrainConfig, {"mode": "act-only"}), 0, 0).mode is Mode.REHEARSAL


def test_sampler_seed_depends_on_seed_step_and_rank_only() -> None:
    cfg = build(TrainConfig, {"seed": 3})
    seeds = {rollout_config(cfg, step, rank).seed for step in range(4) for rank in range(2)}
    assert len(seeds) == 8
    assert rollout_config(cfg, 2, 1).seed == rollout_config(cfg, 2, 1).seed
    assert rollout_config(cfg, 2, 1).seed != rollout_config(build(TrainConfig, {}), 2, 1).seed


@pytest.mark.slow
def test_three_role_wise_grpo_steps_change_the_tiny_model(tmp_path: Path) -> None:
    import torch

    from envace_engine.sink import JsonlSink, read_episodes
    from envace_engine.training import trainer
    from tests.train_job import even_token_share

    config = load(TrainConfig, CONFIGS / "tiny-test.toml", ["steps=3", "checkpoint_every=3"])
    parts = trainer.setup(config)
    # The tiny random model never calls a tool, so the task reward is always 0 (no learning
    # signal); score the sampled tokens instead (see tests/train_job.py).
    parts = dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)
    before = {k: v.clone() for k, v in parts.model.state_dict().items()}
    assert trainer.run(parts, tmp_path, JsonlSink(tmp_path)) == 3

    changed = [k for k, v in parts.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "no parameter changed after 3 GRPO steps"
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    for m in lines:
        assert math.isfinite(m["loss"]) and math.isfinite(m["grad_norm"])
        assert m["rows/act/trained"] > 0 and m["adv/act/nonzero"] > 0
        for key in (
            "reward/act",
            "reward/rehearse",
            "adv/act/std",
            "clip_frac/act",
            "kl/act",
            "fidelity/pairs",
            "perf/tokens_per_s",
            "rollout/drift",
            "success/real",
        ):
            assert key in m, key
    assert any(m["grad_norm"] > 0 for m in lines)
    episodes = read_episodes(tmp_path / "episodes.jsonl")
    assert len(episodes) == 3 * 2 * 2  # steps x tasks x group
    assert all("act" in e["meta"]["advantages"] for e in episodes)
    assert (tmp_path / "checkpoints" / "step-000003" / "model.safetensors").is_file()
