"""SFT data: both roles, and prompts rendered exactly as the rollout renders them at run time."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import pytest

from envace_engine.config import SFTConfig, build
from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.training.sft import build_records, sft_tasks


def _config(**rollout: object) -> SFTConfig:
    return build(
        SFTConfig, {"n_tasks": 6, "task_filter": {"world": "warehouse"}, "rollout": rollout}
    )


class ReplaySampler:
    """Scripted sampler: answers each prompt with the SFT target recorded for that exact prompt.

    A prompt the rollout renders differently from the SFT data has no entry: it is recorded in
    ``unknown`` and answered with an error generation, so the episode stops as a sampler error.
    """

    def __init__(self, tokenizer, records: list[dict]) -> None:
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.table: dict[tuple[int, ...], tuple[int, ...]] = {}
        for r in records:
            key = tokenizer.apply_chat_template(
                r["prompt"], add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
            target = tokenizer.encode(r["completion"][0]["content"], add_special_tokens=False)
            self.table[tuple(key)] = (*target, self.eos)
        self.asked = 0
        self.unknown: list[list[int]] = []

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for prompt in prompts:
            self.asked += 1
            ids = self.table.get(tuple(prompt))
            if ids is None:
                self.unknown.append(prompt)
                out.append(Generation((), (), "error", error="prompt not in the SFT data"))
            else:
                out.append(Generation(ids, (0.0,) * len(ids), "stop"))
        return out


def test_records_hold_both_roles_in_trl_prompt_completion_form() -> None:
    records = build_records(_config(n_examples=0))
    roles = Counter(r["role"] for r in records)
    assert roles["act"] > 0 and roles["rehearse"] > 0
    for r in records:
        assert r["prompt"][0]["role"] == "system" and r["prompt"][-1]["role"] in ("user", "tool")
        assert [m["role"] for m in r["completion"]] == ["assistant"]
        text = r["completion"][0]["content"]
        if r["role"] == "rehearse":
            assert text.startswith("<execution_result>") and text.endswith("</execution_result>")
            json.loads(text.removeprefix("<execution_result>").removesuffix("</execution_result>"))


def test_sft_tasks_filter_and_errors() -> None:
    suite = get_suite("toy")
    tasks = sft_tasks(suite, _config())
    assert len(tasks) == 6 and all(t.meta["world"] == "warehouse" for t in tasks)
    with pytest.raises(ValueError, match="task_filter"):
        sft_tasks(suite, build(SFTConfig, {"task_filter": {"world": "moon"}}))


@pytest.mark.parametrize(("n_examples", "history"), [(0, False), (2, True)])
def test_sft_prompts_are_exactly_the_rollout_prompts(tokenizer, n_examples, history) -> None:
    """Replaying the SFT targets through the real rollout reproduces every prompt and succeeds."""
    config = _config(n_examples=n_examples, rehearse_history=history)
    suite = get_suite("toy")
    tasks = sft_tasks(suite, config)
    sampler = ReplaySampler(tokenizer, build_records(config, suite))
    rollout_cfg = RolloutConfig(
        mode="rehearsal", n_examples=n_examples, rehearse_history=history, max_turns=4
    )
    episodes = rollout(tasks, suite, sampler, tokenizer, rollout_cfg, group_size=1)
    assert sampler.unknown == [], "the rollout asked a prompt the SFT data renders differently"
    assert sampler.asked > len(tasks)
    for task, episode in zip(tasks, episodes, strict=True):
        assert episode.stop_reason.value == "done", (task.id, episode.stop_detail)
        assert episode.drift == 0
        assert len(episode.rehearsals) == sum(len(c) for c in task.reference_calls)
        calls = [
            [c.call for c in episode.calls if c.turn == t] for t in range(len(task.user_turns))
        ]
        assert suite.score(task, calls, list(episode.final_answers)) == 1.0


def tiny_sft_config(**extra: object) -> SFTConfig:
    """Two SFT steps of the tiny model on four warehouse tasks (``extra`` on top)."""
    data: dict = {
        "model": "tiny",
        "n_tasks": 4,
        "max_steps": 2,
        "batch_size": 2,
        "task_filter": {"world": "warehouse"},
        "rollout": {"n_examples": 0},
    }
    return build(SFTConfig, {**data, **extra})


@pytest.mark.slow
def test_run_sft_saves_a_loadable_checkpoint(tmp_path: Path) -> None:
    from envace_engine.models import load_model, resolve
    from envace_engine.sink import JsonlSink
    from envace_engine.training.sft import run_sft

    config = tiny_sft_config()
    out = run_sft(config, tmp_path / "model", JsonlSink(tmp_path))
    model = load_model(resolve(str(out)))
    assert model.config.num_hidden_layers == 4
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [m["sft/loss"] for m in lines if "sft/loss" in m]
    assert len(losses) >= 2 and all(math.isfinite(x) for x in losses)
    assert not list(tmp_path.glob(".model.*"))  # no temporaries left behind


def test_heldout_summary_gives_exact_tool_calls_per_template() -> None:
    from envace_engine.training.sft import Example
    from envace_engine.training.sft.evaluate import summarize, task_templates

    def example(source: str, target: str) -> Example:
        return Example("act", (1,), (2, 3), target, source=source)

    call = '<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>'
    examples = [
        example("t1", call),  # template a: exact
        example("t1", call),  # template a: one token wrong
        example("t2", call),  # template b: exact
        example("t2", "Done."),  # an answer: not a tool call
        example("t9", call),  # a task without a template
    ]
    matches = [(2, 2), (1, 2), (2, 2), (0, 2), (0, 2)]
    m = summarize(examples, matches, "h", {"t1": "a", "t2": "b"})
    assert m["h/act_call_exact"] == 2 / 4
    assert m["h/template/a/act_call_exact"] == 0.5
    assert m["h/template/a/act_call_count"] == 2
    assert m["h/template/b/act_call_exact"] == 1.0
    assert m["h/template/b/act_call_count"] == 1
    assert not any("t9" in k for k in m)
    assert not any("/template/" in k for k in summarize(examples, matches, "h"))
    names = task_templates(SFTConfig(), "validation")
    toy = get_suite("toy").tasks("validation")
    assert names == {t.id: t.meta["template"] for t in toy}
