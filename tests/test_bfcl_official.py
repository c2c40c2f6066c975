"""BFCL fidelity: the ``official`` basis agrees with BFCL's own ``multi_turn_checker``, and a
``miss_func`` tool reaches the agent's prompt exactly at its turn, as a tokenised suffix.

BFCL's checker evals call strings, so it is only ever given the fixed ground truth and
perturbations of it built here (wrong types, excluded and early held-out functions).
"""

from __future__ import annotations

import copy
import itertools
import json
import uuid

import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.bfcl.checker import bfcl_check, call_string
from envace_engine.environments.bfcl.official import make_official_env
from envace_engine.environments.tool_environment import (
    INVALID_PARAMETERS,
    TOOL_EXECUTION_ERROR,
    TOOL_NOT_AVAILABLE,
)
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.types import Mode, Role, Task, ToolCall
from tests.kv_world import ScriptedSampler, call_text, is_rehearse_prompt, last_message

OFFICIAL = get_suite("bfcl")
STRICT = get_suite("bfcl", "strict")


def _bfcl_verdict(task: Task, calls_per_turn: list[list[ToolCall]]) -> dict:
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entry = {
        "id": task.meta["entry_id"],
        "initial_config": copy.deepcopy(task.initial_state),
        "involved_classes": task.meta["involved_classes"],
    }
    decoded = [[[call_string(c) for c in turn]] if turn else [] for turn in calls_per_turn]
    truth = [[c.raw for c in turn] for turn in task.reference_calls]
    return multi_turn_checker(decoded, truth, entry, task.meta["category"], f"t{uuid.uuid4().hex}")


def _retyped(value: object) -> object | None:
    """A wrongly typed stand-in for an argument value (None: leave it alone)."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int | float):
        return str(value)
    if isinstance(value, str):
        return 7
    if isinstance(value, list):
        return json.dumps(value)
    return None


def _perturbations(task: Task) -> list[list[list[ToolCall]]]:
    """The ground truth with one argument wrongly typed (first and last such call), a call of an
    excluded function, and the held-out tool called one turn early (miss_func)."""
    ref = [list(turn) for turn in task.reference_calls]
    spots = [(i, j) for i, turn in enumerate(ref) for j, c in enumerate(turn) if c.arguments]
    out = []
    for i, j in dict.fromkeys([spots[0], spots[-1]] if spots else []):
        call = ref[i][j]
        key = next(iter(call.arguments))
        wrong = _retyped(call.arguments[key])
        if wrong is not None:
            changed = ToolCall(call.name, {**call.arguments, key: wrong})
            out.append([[*t[:j], changed, *t[j + 1 :]] if k == i else t for k, t in enumerate(ref)])
    for name in task.meta.get("excluded_function", [])[:1]:
        first = next(i for i, turn in enumerate(ref) if turn)
        out.append([[*t, ToolCall(name, {})] if k == first else t for k, t in enumerate(ref)])
    for turn, names in task.meta.get("missed_function", {}).items():
        t = int(turn)
        early = [c for c in ref[t] if c.name in names]
        if t > 0 and early:
            out.append([[*c, *early] if k == t - 1 else c for k, c in enumerate(ref)])
    return out


@pytest.mark.parametrize("category", ["base", "miss_func"])
def test_official_verdicts_equal_bfcl_checker_with_wrong_types(category: str) -> None:
    compared = wrong_types = disagree_strict = 0
    for task in OFFICIAL.tasks(category):
        for calls in [[list(t) for t in task.reference_calls], *_perturbations(task)]:
            ours = bfcl_check(task, calls, make_official_env)
            theirs = _bfcl_verdict(task, calls)
            assert ours.valid == theirs["valid"], (task.id, calls, theirs)
            if not ours.valid:
                assert ours.error_type == theirs["error_type"], (task.id, calls)
            strict = STRICT.score(task, calls, []) == 1.0
            disagree_strict += strict != ours.valid
            compared += 1
        wrong_types += len(_perturbations(task))
    assert compared == 200 + wrong_types and wrong_types >= 300
    # The strict mode refuses what BFCL runs, so on these sequences it does disagree somewhere.
    assert disagree_strict > 0
    print(
        f"\n{category}: {compared} sequences, official == BFCL; strict differs on {disagree_strict}"
    )


def test_official_dispatch_runs_like_bfcl_but_stays_safe() -> None:
    task = OFFICIAL.tasks("base")[0]  # GorillaFileSystem + TwitterAPI, cp excluded
    env = OFFICIAL.make_env(task)
    assert env.execute(ToolCall("cd", {"folder": "document"})).ok
    typed = env.execute(ToolCall("cd", {"folder": 3}))  # BFCL runs it: the method itself fails
    assert typed.error is None or typed.error.code == TOOL_EXECUTION_ERROR
    missing = env.execute(ToolCall("mv", {"source": "a"})).error
    assert missing.code == TOOL_EXECUTION_ERROR and "missing 1 required" in missing.message
    excluded = env.execute(ToolCall("cp", {"source": "x", "destination": "y"}))  # BFCL runs it
    assert excluded.error is None or excluded.error.code == TOOL_EXECUTION_ERROR
    for name in ("_load_scenario", "__init__", "rm_rf", "place_order"):
        error = env.execute(ToolCall(name, {})).error
        assert error.code == TOOL_NOT_AVAILABLE and error.message == f"name {name!r} is not defined"
    assert env.execute(ToolCall("run", {})).error.message == "Function call run is not allowed."
    math_task = next(t for t in OFFICIAL.tasks("base") if "MathAPI" in t.meta["involved_classes"])
    math = OFFICIAL.make_env(math_task)
    assert math.execute(ToolCall("power", {"base": 10, "exponent": 10**12})).error.code == (
        INVALID_PARAMETERS
    )
    assert math.execute(ToolCall("power", {"base": 2, "exponent": 10})).value == {"result": 1024}
    assert STRICT.make_env(task).execute(ToolCall("cd", {"folder": 3})).error.code == (
        INVALID_PARAMETERS
    )


def test_bases_are_named_and_checked() -> None:
    assert (OFFICIAL.basis, STRICT.basis, OFFICIAL.bases) == ("official", "strict", OFFICIAL.bases)
    with pytest.raises(ValueError, match="unknown basis 'loose'; valid bases: official, strict"):
        get_suite("bfcl", "loose")
    with pytest.raises(ValueError, match="has one way to score"):
        get_suite("toy", "official")


def _tools_in(prompt: str) -> set[str]:
    return {json.loads(line)["function"]["name"] for line in _tool_lines(prompt)}


def _tool_lines(prompt: str) -> list[str]:
    lines = []
    for block in prompt.split("<tools>\n")[1:]:
        lines += [ln for ln in block.split("\n</tools>")[0].splitlines() if ln.startswith("{")]
    return lines


@pytest.mark.parametrize("mode", [Mode.REAL, Mode.REHEARSAL])
def test_a_miss_func_tool_arrives_in_its_turns_message(tokenizer, mode: Mode) -> None:
    task = OFFICIAL.tasks("miss_func")[0]  # "sort" is held out until turn 3
    world_prompts: list[str] = []

    def script(prompt: str) -> str:
        if is_rehearse_prompt(prompt):
            world_prompts.append(prompt)
            return '<execution_result>{"sorted_content": "x"}</execution_result>'
        _, last = last_message(prompt)
        if "I have updated some more functions" in last and not world_prompts:
            return call_text("sort", file_name="final_report.pdf")
        return "Done."

    sampler = ScriptedSampler(tokenizer, script)
    config = RolloutConfig(mode=mode, n_examples=0, seed=0)
    (ep,) = rollout([task], OFFICIAL, sampler, tokenizer, config)
    act_prompts = [
        tokenizer.decode(b[0])
        for b in sampler.batches
        if not is_rehearse_prompt(tokenizer.decode(b[0]))
    ]
    assert len(act_prompts) >= 5
    for turn, prompt in enumerate(act_prompts[:4]):
        assert ("sort" in _tools_in(prompt)) == (turn >= 3), turn
    assert "sort" not in _tools_in(act_prompts[0].split("<|im_start|>user")[0])  # not in system
    # Token-in/token-out: each act prompt extends the previous one; nothing was re-tokenised.
    ids = [b[0] for b in sampler.batches if not is_rehearse_prompt(tokenizer.decode(b[0]))]
    assert all(later[: len(earlier)] == earlier for earlier, later in itertools.pairwise(ids))
    assert ep.drift == 0
    turn3 = next(s for s in ep.segments if s.role is Role.USER and "I have updated" in s.text)
    assert '"name": "sort"' in turn3.text  # the schema leads the turn's message (BFCL's format)
    assert ep.calls and ep.calls[0].call.name == "sort" and ep.calls[0].turn == 3
    if mode is Mode.REHEARSAL:  # the world role simulates it with its schema, as a candidate
        assert "sort" in _tools_in(world_prompts[0])
        assert ep.calls[0].real is not None and ep.calls[0].real.ok
