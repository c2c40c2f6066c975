"""``bfcl-gen``: deterministic, varied, multi-step tasks whose references replay to success."""

from __future__ import annotations

import json
import random
from collections import defaultdict

import pytest

from envace_engine.environments import get_suite
from envace_engine.environments.bfcl.gen import TEMPLATES
from envace_engine.environments.generated import content_key


def test_deterministic_by_seed_and_index() -> None:
    suite = get_suite("bfcl-gen")
    assert suite.generate(30, seed=5) == suite.generate(30, seed=5)
    assert suite.generate(10, seed=5)[:4] == suite.generate(4, seed=5)
    other = suite.generate(30, seed=6)
    assert [t.user_turns for t in other] != [t.user_turns for t in suite.generate(30, seed=5)]


def test_templates_cover_four_classes_with_multi_step_and_multi_turn() -> None:
    per_class: dict[str, set[str]] = defaultdict(set)
    multi_turn = set()
    for template in TEMPLATES:
        for k in range(5):
            draft = template(random.Random(k))
            assert sum(len(turn) for turn in draft.calls) >= 2, draft.template
            assert len(draft.calls) == len(draft.user_turns)
            per_class[draft.meta["involved_classes"][0]].add(draft.template)
            if len(draft.user_turns) >= 2:
                multi_turn.add(draft.template)
    assert len(per_class) >= 4
    assert all(len(names) >= 5 for names in per_class.values()), per_class
    assert len(multi_turn) >= 8


def test_thousand_tasks_generate_and_every_reference_replays_to_success() -> None:
    suite = get_suite("bfcl-gen")
    tasks = suite.generate(1000, seed=11)
    assert len({t.id for t in tasks}) == 1000
    assert {t.meta["template"] for t in tasks} == {t.__name__ for t in TEMPLATES}
    for task in tasks:
        assert len(task.reference_results) == len(task.reference_calls)
        reference = [list(turn) for turn in task.reference_calls]
        assert suite.score(task, reference, []) == 1.0, task.id


def test_wrong_calls_fail() -> None:
    suite = get_suite("bfcl-gen")
    for task in suite.generate(60, seed=12):
        calls = [list(turn) for turn in task.reference_calls]
        calls[-1] = calls[-1][:-1]  # the last call of the last turn is missing
        assert suite.score(task, calls, []) == 0.0, task.id
        assert suite.score(task, [[] for _ in task.user_turns], []) == 0.0


def test_splits_are_fixed_disjoint_and_named() -> None:
    suite = get_suite("bfcl-gen")
    train, validation = suite.tasks("train"), suite.tasks("validation")
    assert (len(train), len(validation)) == (512, 64)
    assert suite.tasks("train") == train  # cached and stable
    assert not {t.id for t in train} & {t.id for t in validation}
    assert not {content_key(t) for t in train} & {content_key(t) for t in validation}
    with pytest.raises(ValueError, match="valid splits: train, validation"):
        suite.tasks("test")


def test_no_overlap_with_bfcl_entries() -> None:
    bfcl = get_suite("bfcl").tasks("test")
    bfcl_turns = {turn for t in bfcl for turn in t.user_turns}
    bfcl_states = {json.dumps(t.initial_state, sort_keys=True) for t in bfcl}
    for task in get_suite("bfcl-gen").tasks("train"):
        assert not set(task.user_turns) & bfcl_turns, task.id
        assert json.dumps(task.initial_state, sort_keys=True) not in bfcl_states


def test_many_environments_alive_at_once_stay_independent() -> None:
    """A batch of episodes stepping in lockstep ends where each one alone would."""
    suite = get_suite("bfcl-gen")
    tasks = suite.tasks("validation")
    alone = []
    for task in tasks:
        env = suite.make_env(task)
        for turn, calls in enumerate(task.reference_calls):
            env.start_turn(turn)
            for c in calls:
                env.execute(c)
        alone.append(env.state())
    batch = [suite.make_env(t) for t in tasks]
    steps = [
        [(turn, c) for turn, calls in enumerate(t.reference_calls) for c in calls] for t in tasks
    ]
    for k in range(max(len(s) for s in steps)):
        for env, task_steps in zip(batch, steps, strict=True):
            if k < len(task_steps):
                turn, c = task_steps[k]
                env.start_turn(turn)
                assert env.execute(c).ok
    assert [env.state() for env in batch] == alone
    assert [suite.make_env(t).state() for t in tasks] != alone  # the references do change state
