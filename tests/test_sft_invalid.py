"""SFT examples in which the world role rules a call invalid (``training.sft.invalid``): variants
by hand, targets from the real toy environment, prompts exactly the rollout's."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter

from envace_engine.config import SFTConfig, build
from envace_engine.environments import get_suite
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.parsing import parse_tool_calls
from envace_engine.rollout.prompts import ChatSample, RehearseContext
from envace_engine.samplers.base import Generation, SamplingParams
from envace_engine.training.sft import all_samples, sft_tasks
from envace_engine.training.sft.evaluate import kind_of
from envace_engine.training.sft.invalid import invalid_samples, invalid_variant
from envace_engine.types import StopReason, ToolCall

BANK = [
    {"name": "get_balance", "parameters": {"properties": {"account": {"type": "string"}}}},
    {
        "name": "deposit",
        "parameters": {
            "properties": {"account": {"type": "string"}, "amount": {"type": "integer"}},
            "required": ["account", "amount"],
        },
    },
]


def _config(fraction: float) -> SFTConfig:
    return build(
        SFTConfig,
        {
            "n_tasks": 6,
            "task_filter": {"world": "bank"},
            "invalid_fraction": fraction,
            "rollout": {"n_examples": 0, "grounded_rehearsal": False},
        },
    )


def test_each_kind_of_variant_by_hand() -> None:
    deposit = ToolCall("deposit", {"account": "dan", "amount": 5})
    balance = ToolCall("get_balance", {"account": "dan"})
    kinds: Counter[str] = Counter()
    for seed in range(40):
        variant = invalid_variant(deposit, BANK, random.Random(seed))
        assert variant is not None and variant.name == "deposit"
        args = variant.arguments
        if len(args) == 1:
            kinds["missing"] += 1  # a required argument dropped
        elif args.get("amount") == "5" or args.get("account") == 3:
            kinds["type"] += 1  # a number as a string, or a string's length as a number
        else:
            assert set(args) - {"account", "amount"} == {"note"}  # no other tool's argument
            kinds["extra"] += 1
    assert set(kinds) == {"missing", "type", "extra"}
    # get_balance has no required argument: only extra (another tool's: amount) or type
    for seed in range(20):
        args = invalid_variant(balance, BANK, random.Random(seed)).arguments
        assert args in ({"account": "dan", "amount": args.get("amount")}, {"account": 3})


def test_targets_are_the_real_environments_errors() -> None:
    config = _config(1.0)
    suite = get_suite("toy")
    task = sft_tasks(suite, config)[0]
    ctx = RehearseContext(tools=tuple(task.tools), task=task, grounded=False, with_history=True)
    samples = invalid_samples(ctx, suite, 1.0, seed=0)
    assert len(samples) == sum(len(c) for c in task.reference_calls)
    for sample in samples:
        assert sample.role == "rehearse" and kind_of(sample) == "rehearse_invalid"
        body = sample.target.removeprefix("<execution_result>").removesuffix("</execution_result>")
        result = json.loads(body)
        variant = _variant(sample.prompt[-1].content)
        real = suite.make_env(task).execute(variant)
        assert result == {"error": {"code": real.error.code, "message": real.error.message}}
        assert real.error.code == "INVALID_PARAMETERS"
    assert invalid_samples(ctx, suite, 0.0, seed=0) == []


def test_only_invalid_call_errors_count_as_invalid_rehearsals() -> None:
    def kind(target: str) -> str:
        return kind_of(ChatSample(prompt=(), target=target, role="rehearse"))

    own = '<execution_result>{"error": "unknown item x"}</execution_result>'  # a tool's own error
    flag = '<execution_result>{"error": {"code": "INVALID_PARAMETERS", "message": "m"}}'
    assert kind(own) == "rehearse" and kind(flag + "</execution_result>") == "rehearse_invalid"


def test_a_zero_fraction_leaves_the_sft_data_as_it_was() -> None:
    suite = get_suite("toy")
    plain = all_samples(_config(0.0), suite)
    assert all(kind_of(s) != "rehearse_invalid" for s in plain)
    mixed = all_samples(_config(0.5), suite)
    extra = [s for s in mixed if kind_of(s) == "rehearse_invalid"]
    assert 0 < len(extra) < len([s for s in plain if s.role == "rehearse"])
    assert sorted(map(repr, mixed)) == sorted(map(repr, [*plain, *extra]))


def _variant(rehearse_user: str) -> ToolCall:
    """The call an invalid sample's prompt shows as the agent's latest reply."""
    reply = rehearse_user.split("Latest assistant reply:\n")[1].split("\n\n")[0]
    (call,) = parse_tool_calls(reply).calls
    return call


class WorldFromSFT:
    """Act role: replies ``reply`` first, then gives up. World role: the SFT target of exactly
    this rehearse prompt (an unknown prompt is a sampler error)."""

    def __init__(self, tokenizer, samples, reply: str) -> None:
        self.tokenizer, self.reply, self.unknown = tokenizer, reply, 0
        self.eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.table = {self._ids(s.prompt): s.target for s in samples}

    def _ids(self, messages) -> tuple[int, ...]:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        return tuple(
            self.tokenizer.apply_chat_template(
                chat, add_generation_prompt=True, tokenize=True, return_dict=True
            )["input_ids"]
        )

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        out = []
        for prompt in prompts:
            text = self.tokenizer.decode(prompt)
            if "precise tool simulator" in text:
                target = self.table.get(tuple(prompt))
                self.unknown += target is None
                text = target or ""
            else:
                text = self.reply
            ids = (*self.tokenizer.encode(text, add_special_tokens=False), self.eos)
            out.append(Generation(ids, (0.0,) * len(ids), "stop"))
        return out


def test_the_rollout_meets_the_sft_prompt_and_the_world_flags_the_call(tokenizer) -> None:
    """An agent that makes the invalid variant of its first reference call: the rollout's
    rehearse prompt is the SFT example's, and the trained answer is the shadow env's error."""
    config = _config(1.0)
    suite = get_suite("toy")
    task = sft_tasks(suite, config)[0]
    samples = [s for s in all_samples(config, suite) if kind_of(s) == "rehearse_invalid"]
    ctx = RehearseContext(tools=tuple(task.tools), task=task, grounded=False, with_history=True)
    first = invalid_samples(ctx, suite, 1.0, config.seed)[0]  # the task's first reference call
    assert first in [dataclasses.replace(s, group="", source="") for s in samples]
    reply = first.prompt[-1].content.split("Latest assistant reply:\n")[1].split("\n\n")[0]
    sampler = WorldFromSFT(tokenizer, samples, reply)
    rollout_cfg = RolloutConfig(mode="rehearsal", n_examples=0, grounded_rehearsal=False)
    (episode,) = rollout([task], suite, sampler, tokenizer, rollout_cfg, group_size=1)
    assert sampler.unknown == 0
    assert episode.stop_reason is StopReason.INVALID_REHEARSAL
    (call,) = episode.calls
    rehearsed, real = call.rehearsed.error, call.real.error  # (``text`` is the raw call)
    assert (rehearsed.code, rehearsed.message) == (real.code, real.message)
