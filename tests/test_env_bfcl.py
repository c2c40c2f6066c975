"""The ``bfcl`` suite: our verdict equals BFCL's own multi-turn checker, state never leaks.

BFCL's checker evals call strings, so it is only ever given the fixed benchmark ground truth
and mutations of it built here — never model output.
"""

from __future__ import annotations

import copy
import time
import uuid

import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.bfcl.backends import make_bfcl_env
from envace_engine.environments.bfcl.checker import bfcl_check, call_string, parse_call_string
from envace_engine.environments.bfcl.suite import ADDED_FUNCTIONS_PROMPT
from envace_engine.environments.tool_environment import TOOL_NOT_AVAILABLE
from envace_engine.types import Task, ToolCall


def _bfcl_verdict(task: Task, calls_per_turn: list[list[ToolCall]]) -> dict:
    """BFCL's own checker on call strings (fresh model name: BFCL caches instances by name)."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    entry = {
        "id": task.meta["entry_id"],
        "initial_config": copy.deepcopy(task.initial_state),
        "involved_classes": task.meta["involved_classes"],
    }
    decoded = [[[call_string(c) for c in turn]] if turn else [] for turn in calls_per_turn]
    truth = [[c.raw for c in turn] for turn in task.reference_calls]
    model = f"envace_test_{uuid.uuid4().hex}"
    return multi_turn_checker(decoded, truth, entry, task.meta["category"], model)


def _reference(task: Task) -> list[list[ToolCall]]:
    return [list(turn) for turn in task.reference_calls]


def test_every_base_ground_truth_replays_to_success() -> None:
    suite = get_suite("bfcl")
    tasks = suite.tasks("base")
    t0 = time.perf_counter()
    scores = [suite.score(t, _reference(t), []) for t in tasks]
    elapsed = time.perf_counter() - t0
    assert len(tasks) == 200
    assert sum(scores) == 200, [t.id for t, s in zip(tasks, scores, strict=True) if s != 1.0]
    print(f"\nmulti_turn_base ground truth: 200/200 valid in {elapsed:.2f} s")


def test_every_category_ground_truth_is_valid_and_executes_cleanly() -> None:
    suite = get_suite("bfcl")
    for category in ("miss_func", "miss_param", "long_context"):
        tasks = suite.tasks(category)
        assert len(tasks) == 200
        assert all(suite.score(t, _reference(t), []) == 1.0 for t in tasks), category
    refused = set()
    strict = get_suite("bfcl", "strict")
    for task in strict.tasks("test"):
        env = strict.make_env(task)
        for turn, calls in enumerate(task.reference_calls):
            env.start_turn(turn)
            for c in calls:
                result = env.execute(c)
                if not result.ok:
                    refused.add((task.id, c.raw, result.error.code))
    # Benchmark quirks, refused by the strict basis's rules (the verdict is unaffected; the
    # official basis runs them, as BFCL does: tests/test_bfcl_official.py): entry 173 passes
    # a string ticket id for an integer parameter; miss_func_49 calls ``tail`` two turns
    # before BFCL offers it.
    quirk = "close_ticket(ticket_id='ticket_001')"
    assert refused == {
        *{
            (f"bfcl/multi_turn_{c}_173", quirk, "INVALID_PARAMETERS")
            for c in ("base", "miss_func", "miss_param", "long_context")
        },
        ("bfcl/multi_turn_miss_func_49", "tail(file_name='file3.txt')", "TOOL_NOT_AVAILABLE"),
    }


def _mutations(task: Task) -> list[list[list[ToolCall]]]:
    """Wrong call sequences: a turn left empty, the last call dropped, a string argument changed."""
    ref = _reference(task)
    out = []
    first = next(i for i, turn in enumerate(ref) if turn)
    out.append([[] if i == first else turn for i, turn in enumerate(ref)])
    last = max(i for i, turn in enumerate(ref) if turn)
    out.append([turn[:-1] if i == last else turn for i, turn in enumerate(ref)])
    for i, turn in enumerate(ref):
        for j, c in enumerate(turn):
            keys = [k for k, v in c.arguments.items() if isinstance(v, str)]
            if keys:
                changed = ToolCall(c.name, {**c.arguments, keys[0]: "zz_" + c.arguments[keys[0]]})
                out.append(
                    [[*t[:j], changed, *t[j + 1 :]] if k == i else t for k, t in enumerate(ref)]
                )
                return out
    return out


def test_verdicts_equal_bfcl_checker_on_ground_truth_and_wrong_sequences() -> None:
    tasks = get_suite("bfcl").tasks("base")
    compared = wrong = 0
    for task in tasks:
        for calls in [_reference(task), *_mutations(task)]:
            ours = bfcl_check(task, calls, make_bfcl_env)
            theirs = _bfcl_verdict(task, calls)
            assert ours.valid == theirs["valid"], (task.id, calls, theirs)
            if not ours.valid:
                assert ours.error_type == theirs["error_type"], task.id
                wrong += 1
            compared += 1
    assert compared == 800  # 200 ground truths + 600 mutations
    assert wrong == 590  # a few mutations are harmless (e.g. a dropped trailing ls); BFCL agrees


def test_wrong_sequences_score_zero() -> None:
    suite = get_suite("bfcl")
    task = suite.tasks("base")[0]
    assert suite.score(task, _reference(task), []) == 1.0
    assert suite.score(task, [[] for _ in task.user_turns], []) == 0.0
    assert suite.score(task, _reference(task)[:-1], []) == 0.0  # a turn missing: terminated
    assert suite.score(task, _mutations(task)[1], []) == 0.0


def test_fresh_state_per_episode_and_no_bfcl_globals() -> None:
    from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils

    task = get_suite("bfcl").tasks("base")[0]
    original = copy.deepcopy(task.initial_state)
    cached_before = set(vars(multi_turn_utils))
    first, second = make_bfcl_env(task), make_bfcl_env(task)
    first.execute(ToolCall("mkdir", {"dir_name": "leak"}))
    first.execute(ToolCall("cd", {"folder": "document"}))
    assert "leak" in first.state()["GorillaFileSystem"]["root"]["contents"]
    assert "leak" not in second.state()["GorillaFileSystem"]["root"]["contents"]
    assert make_bfcl_env(task).state() == second.state()
    assert task.initial_state == original
    assert set(vars(multi_turn_utils)) == cached_before


def test_miss_func_tool_arrives_at_its_turn() -> None:
    task = get_suite("bfcl").tasks("miss_func")[0]
    assert task.meta["missed_function"] == {"3": ["sort"]}
    assert task.user_turns[3] == ADDED_FUNCTIONS_PROMPT
    env = make_bfcl_env(task)
    assert "sort" not in [t["function"]["name"] for t in env.tools()]
    early = env.execute(ToolCall("sort", {"file_name": "final_report.pdf"}))
    assert early.error.code == TOOL_NOT_AVAILABLE
    env.start_turn(3)
    assert "sort" in [t["function"]["name"] for t in env.tools()]


def test_task_fields_and_splits() -> None:
    suite = get_suite("bfcl")
    task = suite.tasks("long_context")[0]
    assert task.id == "bfcl/multi_turn_long_context_0"
    assert task.meta["category"] == "long_context" and task.meta["long_context"] is True
    assert all(
        inst.long_context
        for inst in make_bfcl_env(task).instances.values()
        if hasattr(inst, "long_context")
    )
    assert {"entry_id", "involved_classes", "excluded_function", "path"} <= set(task.meta)
    assert len(suite.tasks("test")) == 800
    assert len({t.id for t in suite.tasks("test")}) == 800
    with pytest.raises(ValueError, match="valid splits: test, base, miss_func"):
        suite.tasks("train")


def test_ground_truth_strings_parse_positional_and_keyword_args() -> None:
    order = {"sort": ("file_name",), "mv": ("source", "destination")}.__getitem__
    assert parse_call_string("sort('a.txt')", order).arguments == {"file_name": "a.txt"}
    call = parse_call_string("mv('a', destination=\"b\")", order)
    assert (call.name, call.arguments) == ("mv", {"source": "a", "destination": "b"})
    with pytest.raises(ValueError, match="not a plain function call"):
        parse_call_string("os.system('x')", order)
    with pytest.raises(ValueError, match="malformed node"):
        parse_call_string("mv(source=__import__('os'))", order)
