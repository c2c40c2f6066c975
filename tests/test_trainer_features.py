"""Trainer features on the tiny model: shared-prefix steps equal plain ones, held-out probes,
sampler/trainer mismatch metrics, and the external-simulator arm."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

from envace_engine.config import TrainConfig, load
from envace_engine.sink import JsonlSink, read_episodes
from envace_engine.training import trainer
from tests.train_job import even_token_share, member_spread

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
pytestmark = pytest.mark.slow


def _parts(*overrides: str):
    config = load(TrainConfig, CONFIGS / "tiny-test.toml", list(overrides))
    parts = trainer.setup(config)
    # the random tiny model never succeeds: score its sampled tokens so rows have advantages
    return dataclasses.replace(parts, reward=even_token_share, reward_is_success=False)


def _metrics(folder: Path) -> list[dict]:
    return [json.loads(x) for x in (folder / "metrics.jsonl").read_text().splitlines()]


def _grads_at_step(parts) -> dict:
    """Record the gradients the optimizer steps with (after clipping): comparing weights after
    an AdamW step would not do, since it maps a near-zero gradient to about ±lr by its sign."""
    seen: dict = {}

    def hook(optimizer, args, kwargs):
        for n, p in parts.model.named_parameters():
            if p.grad is not None:
                seen[n] = p.grad.detach().clone()

    parts.optimizer.register_step_pre_hook(hook)
    return seen


def test_shared_prefix_step_gives_the_gradients_of_a_plain_step(tmp_path):
    import torch

    shared, plain = _parts("steps=1", "share_prefix=true"), _parts("steps=1", "share_prefix=false")
    a, b = _grads_at_step(shared), _grads_at_step(plain)
    trainer.run(shared, tmp_path / "a", JsonlSink(tmp_path / "a"))
    trainer.run(plain, tmp_path / "b", JsonlSink(tmp_path / "b"))
    la, lb = _metrics(tmp_path / "a")[0], _metrics(tmp_path / "b")[0]
    assert la["optim/rows_forward"] > 0 and la["optim/micro_batches"] >= 1
    assert la["loss"] == pytest.approx(lb["loss"], rel=1e-5, abs=1e-7)
    assert a.keys() == b.keys() and a
    for name in a:
        torch.testing.assert_close(a[name], b[name], atol=1e-6, rtol=1e-4, msg=name)


def test_probes_and_mismatch_metrics(tmp_path):
    # mismatch metrics are logged by a step that trains rows: force advantages in every group
    parts = dataclasses.replace(
        _parts("steps=2", "probe.every=1", "probe.n_tasks=2"), reward=member_spread
    )
    trainer.run(parts, tmp_path, JsonlSink(tmp_path))
    lines = _metrics(tmp_path)
    assert [m["step"] for m in lines] == [0, 1, 2]  # step 2: the final probe, metrics only
    for m in lines:
        assert {"heldout/success", "heldout/rehearsed_success", "heldout/gap"} <= set(m)
    for m in lines[:2]:
        assert 0 <= m["rollout/logprob_diff"] < 0.1 and m["rollout/mismatch_kl"] >= 0
        assert math.isfinite(m["loss"])


def test_simulator_arm_answers_with_a_frozen_copy_and_trains_act_rows(tmp_path):
    import torch

    parts = _parts("steps=1", "mode=simulator")
    assert parts.simulator is not None and parts.simulator.model is not parts.model
    frozen = {k: v.clone() for k, v in parts.simulator.model.state_dict().items()}
    trainer.run(parts, tmp_path, JsonlSink(tmp_path))
    m = _metrics(tmp_path)[0]
    assert m["rows/rehearse/trained"] == 0 and m["rows/act/trained"] > 0
    after = parts.simulator.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in frozen.items())  # never trained
    calls = [c for e in read_episodes(tmp_path / "episodes.jsonl") for c in e["calls"]]
    assert all(c["shown"] == "simulated" for c in calls)


class _Memo:
    """A ``probe.ProbeMemo`` in a dict."""

    def __init__(self) -> None:
        self.kept: dict[str, dict] = {}

    def recall(self, key):
        return self.kept.get(key)

    def remember(self, key, metrics):
        self.kept[key] = dict(metrics)


def test_step0_probe_runs_once_for_runs_that_share_it(tmp_path, monkeypatch):
    calls = []
    real = trainer.run_probe
    monkeypatch.setattr(
        trainer, "run_probe", lambda *a: calls.append(a[1]) or real(*a)
    )  # counts (step) and runs it
    memo = _Memo()
    overrides = ("steps=1", "probe.every=1", "probe.n_tasks=2")
    trainer.run(_parts(*overrides), tmp_path / "a", JsonlSink(tmp_path / "a"), memo=memo)
    assert calls == [0, 1] and len(memo.kept) == 1
    # another mode starts from the same weights with the same probe: step 0 is recalled
    trainer.run(
        _parts(*overrides, "mode=act-only"), tmp_path / "b", JsonlSink(tmp_path / "b"), memo=memo
    )
    assert calls == [0, 1, 1]
    first, second = _metrics(tmp_path / "a")[0], _metrics(tmp_path / "b")[0]
    held = {k: v for k, v in first.items() if k.startswith("heldout/")}
    assert held and held == {k: v for k, v in second.items() if k.startswith("heldout/")}
    assert "perf/probe_s" in first and "perf/probe_s" not in second  # its time was spent in a
    # other probe settings are another probe: it runs
    trainer.run(
        _parts(*overrides, "probe.temperature=0.5"),
        tmp_path / "c",
        JsonlSink(tmp_path / "c"),
        memo=memo,
    )
    assert calls == [0, 1, 1, 0, 1] and len(memo.kept) == 2


def test_world_fidelity_rows_train_and_report_f_and_collusion(tmp_path):
    """Plumbing of the world role's signals with a scripted tool-using policy (it makes each
    task's reference call and rehearses ``{"imagined": true}``): rehearse rows with their own
    rewards, F known for every rehearsal (reference path), the auxiliary NLL on each known
    answer, the KL anchor (zero before the first update: the reference is the start)."""
    from tests.test_rehearsal import ScriptedPolicy

    parts = _parts(
        "steps=1",
        "rollout.max_new_tokens_act=64",
        "rollout.max_new_tokens_rehearse=32",
        "world.task_weight=0.5",
        "loss.world_nll=0.5",
        "loss.world_kl=0.1",
        "loss.world_nll_replay=2",
    )
    assert parts.ref_model is not None
    policy = ScriptedPolicy(parts.tokenizer, parts.tasks)
    parts = dataclasses.replace(parts, sampler=policy, reward=member_spread)
    trainer.run(parts, tmp_path, JsonlSink(tmp_path))
    m = _metrics(tmp_path)[0]
    rehearsals = sum(len(e["rehearsals"]) for e in read_episodes(tmp_path / "episodes.jsonl"))
    assert rehearsals > 0 and m["rows/rehearse/trained"] == rehearsals
    assert m["world/f_rows"] == rehearsals
    assert m["world/nll_rows"] == rehearsals + 2  # and two replayed SFT rehearse examples
    assert 0 <= m["world/f_mean"] < 1  # "imagined" is never the recorded result
    assert m["loss/world_nll"] > 0 and m["kl/rehearse"] == 0.0
    assert m["collusion/echo_rate"] == 0.0
