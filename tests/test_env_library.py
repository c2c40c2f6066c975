"""``toy-library``: one shared catalogue, the world-state block of rehearse prompts, and the
switch recorded with every rehearsal."""

from __future__ import annotations

import dataclasses

from envace_engine.environments import get_suite
from envace_engine.environments.check import check_suite
from envace_engine.environments.generated import content_key
from envace_engine.environments.toy.library import CATALOGUE, Library, initial_state
from envace_engine.rollout.loop import RolloutConfig, rollout
from envace_engine.rollout.prompts import RehearseContext, first_user_text, rehearse_messages
from envace_engine.types import Mode, TaskKey, ToolCall
from tests.test_rehearsal import ScriptedPolicy


def test_the_library_lends_until_no_copy_is_left_and_takes_books_back():
    lib = Library(initial_state())
    assert lib.find_book("blue hour") == {
        "title": "blue hour",
        "author": "ines vale",
        "year": 1991,
        "available": 1,
    }
    assert lib.borrow("blue hour", "ann")["available"] == 0
    assert lib.borrow("blue hour", "bob") == {"error": "no copy of blue hour available"}
    assert lib.return_book("blue hour", "bob") == {"error": "bob does not hold blue hour"}
    assert lib.return_book("blue hour", "ann")["available"] == 1
    assert lib.books_by("mira chen") == {
        "author": "mira chen",
        "titles": ["long night", "moss house"],
    }
    assert lib.find_book("nope") == {"error": "no book titled nope"}


def test_every_task_shares_one_database_the_agent_is_not_told():
    suite = get_suite("toy-library")
    train, validation = suite.tasks("train"), suite.tasks("validation")
    assert (len(train), len(validation)) == (512, 64)
    assert {content_key(t) for t in validation}.isdisjoint(content_key(t) for t in train)
    assert all(t.initial_state == initial_state() for t in train + validation)
    report = check_suite(suite, train + validation)
    assert report.passed == report.tasks  # every reference solution scores 1
    assert check_suite(suite, validation, agent="nothing").passed == 0
    task = validation[0]
    assert all(str(year) not in first_user_text(task) for _, year, _ in CATALOGUE.values())
    state = task.meta[TaskKey.WORLD_STATE]
    assert all(title in state and str(year) in state for title, (_, year, _) in CATALOGUE.items())


def test_toy_world_states_carry_note_texts():
    notes = [t for t in get_suite("toy").tasks("validation") if t.meta["world"] == "notes"]
    task = notes[0]
    for title, text in task.initial_state["notes"].items():
        assert (
            repr(text) in task.meta[TaskKey.WORLD_STATE] and title in task.meta[TaskKey.WORLD_STATE]
        )


def test_the_world_state_block_follows_the_switch():
    task = get_suite("toy-library").tasks("validation")[0]
    call = ToolCall("find_book", {"title": "open sea"})
    on = RehearseContext(tools=task.tools, task=task, grounded=False, stated=True)
    off = RehearseContext(tools=task.tools, task=task, grounded=False)
    text_on = rehearse_messages(on, [], "reply", call)[-1].content
    text_off = rehearse_messages(off, [], "reply", call)[-1].content
    assert "Environment state at the start of the task:\nCatalogue: " in text_on
    assert "Environment state" not in text_off and "1994" not in text_off
    without_state = RehearseContext(
        tools=task.tools, task=dataclasses.replace(task, meta={}), stated=True
    )
    assert not without_state.states_world  # nothing to show: recorded as not stated


def test_each_rehearsal_records_whether_it_was_stated(tokenizer):
    tasks = get_suite("toy-library").tasks("validation")[:2]
    for stated in (True, False):
        config = RolloutConfig(
            mode=Mode.REHEARSAL,
            n_examples=0,
            seed=1,
            check_drift=False,
            world_state=stated,
            max_new_tokens_act=64,
            max_new_tokens_rehearse=32,
        )
        episodes = rollout(
            tasks, get_suite("toy-library"), ScriptedPolicy(tokenizer, tasks), tokenizer, config, 1
        )
        rehearsals = [r for e in episodes for r in e.rehearsals]
        assert rehearsals and all(r.stated is stated for r in rehearsals)
