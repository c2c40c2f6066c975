"""``toy``: tiny worlds, partial-credit scores pinned by hand, whole episodes under 600 tokens."""

from __future__ import annotations

import json
import random

import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.toy.suite import answer_credit, state_credit
from envace_engine.environments.toy.templates import TEMPLATES
from envace_engine.environments.toy.worlds import WORLDS
from envace_engine.types import Task, ToolCall


def _task(state: dict, turns: list[str], calls: list[list[ToolCall]], answers: list[str]) -> Task:
    return Task(
        id="toy/hand",
        suite="toy",
        user_turns=tuple(turns),
        tools=tuple(WORLDS["warehouse"].TOOLS),
        initial_state=state,
        reference_calls=tuple(tuple(c) for c in calls),
        meta={"world": "warehouse", "answers": answers},
    )


SHIP = _task(
    {"stock": {"pens": 3, "cups": 5}},
    ["Ship 2 pens and tell me how many are left."],
    [[ToolCall("remove_stock", {"item": "pens", "qty": 2})]],
    ["1"],
)
REMOVE_2_PENS = ToolCall("remove_stock", {"item": "pens", "qty": 2})


@pytest.mark.parametrize(
    ("calls", "answer", "expected"),
    [
        ([REMOVE_2_PENS], "1 pen is left", 1.0),
        ([REMOVE_2_PENS], "2 left", 0.5),  # state right, answer wrong
        ([], "1", 0.5),  # answer right, nothing done: the changed entry (pens) is wrong
        # pens right, a spurious cups change wrong -> state 1/2; answer right -> (0.5 + 1) / 2
        ([REMOVE_2_PENS, ToolCall("add_stock", {"item": "cups", "qty": 1})], "1", 0.75),
        ([ToolCall("remove_stock", {"item": "pens", "qty": 1})], "11", 0.0),
        ([ToolCall("remove_stock", {"item": "pens", "qty": 9})], "1", 0.5),  # refused: no change
    ],
)
def test_ship_task_partial_credit(calls: list[ToolCall], answer: str, expected: float) -> None:
    assert get_suite("toy").score(SHIP, [calls], [answer]) == pytest.approx(expected)


def test_credit_functions_by_hand() -> None:
    init = {"a": {"x": 1, "y": 2, "z": 3}}
    ref = {"a": {"x": 5, "y": 2, "z": 3}}
    assert state_credit(init, ref, ref) == 1.0
    assert state_credit(init, ref, init) == 0.0
    assert state_credit(init, ref, {"a": {"x": 5, "y": 0, "z": 0}}) == pytest.approx(1 / 3)
    assert state_credit(init, init, init) == 1.0  # nothing to change, nothing changed
    assert state_credit(init, ref, {"a": {"x": 5, "y": 2, "z": 3, "w": 1}}) == 0.5  # added key
    assert answer_credit(["", "7"], ["ok", "there are 7 now"]) == 1.0
    assert answer_credit(["", "7"], ["7", "17"]) == 0.0
    assert answer_credit(["5", "milk"], ["5.5", "MILK!"]) == 0.5
    assert answer_credit(["", ""], ["x", "y"]) is None


def test_read_only_task_is_scored_by_its_answer_alone() -> None:
    task = _task(
        {"stock": {"pens": 3}},
        ["How many pens?"],
        [[ToolCall("check_stock", {"item": "pens"})]],
        ["3"],
    )
    assert get_suite("toy").score(task, [[]], ["3"]) == 1.0
    assert get_suite("toy").score(task, [[]], ["4"]) == 0.0


def test_worlds_are_tiny_and_refuse_like_bfcl_backends() -> None:
    for world in WORLDS.values():
        assert len(world.TOOLS) <= 5
        assert all(len(json.dumps(t["function"])) <= 280 for t in world.TOOLS)
    env = get_suite("toy").make_env(SHIP)
    refused = env.execute(ToolCall("remove_stock", {"item": "pens", "qty": 4}))
    assert refused.ok and refused.value == {"error": "cannot remove 4 pens: 3 in stock"}
    assert env.execute(ToolCall("remove_stock", {"item": "pens", "qty": "4"})).error
    assert env.state() == {"stock": {"pens": 3, "cups": 5}}


def test_every_reference_scores_one_and_splits_are_fixed() -> None:
    suite = get_suite("toy")
    train, validation = suite.tasks("train"), suite.tasks("validation")
    assert (len(train), len(validation)) == (512, 64)
    names = {template(random.Random(0)).template for template in TEMPLATES}
    assert len(names) == 15 and {t.meta["template"] for t in train} == names
    for task in train + validation:
        answers = list(task.meta["answers"])
        assert suite.score(task, [list(c) for c in task.reference_calls], answers) == 1.0
        assert suite.score(task, [[] for _ in task.user_turns], ["" for _ in answers]) == 0.0
        assert task.system.endswith("Use the tools, then answer briefly.")
    assert suite.generate(20, seed=3) == suite.generate(20, seed=3)


def test_whole_episode_fits_in_600_tokens(tokenizer) -> None:
    """System + tools + every user turn, reference call, result and answer, chat-rendered."""
    longest = 0
    for task in get_suite("toy").tasks("validation"):
        tools = "\n".join(json.dumps(t["function"]) for t in task.tools)
        messages = [{"role": "system", "content": f"{task.system}\nTools:\n{tools}"}]
        for turn, text in enumerate(task.user_turns):
            messages.append({"role": "user", "content": text})
            for call, result in zip(
                task.reference_calls[turn], task.reference_results[turn], strict=True
            ):
                request = json.dumps({"name": call.name, "arguments": call.arguments})
                messages.append(
                    {"role": "assistant", "content": f"<tool_call>{request}</tool_call>"}
                )
                messages.append({"role": "user", "content": json.dumps(result)})
            messages.append({"role": "assistant", "content": f"Done. {task.meta['answers'][turn]}"})
        ids = tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True)["input_ids"]
        longest = max(longest, len(ids))
    assert longest <= 600
