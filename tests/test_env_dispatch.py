"""Dispatch safety: only whitelisted tools run, arguments are checked first, errors are data."""

from __future__ import annotations

import copy
import inspect
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from envace_engine.environments import get_suite
from envace_engine.environments.bfcl.backends import BACKENDS, backend_class, class_tools
from envace_engine.environments.schema import bfcl_to_json_schema, check_object
from envace_engine.environments.tool_environment import (
    INVALID_PARAMETERS,
    TOOL_EXECUTION_ERROR,
    TOOL_NOT_AVAILABLE,
    ToolEnvironment,
    jsonable,
    public_state,
)
from envace_engine.types import Task, ToolCall

STRICT = ("bfcl", "strict")  # the validated dispatcher (the official basis: test_bfcl_official)


@pytest.fixture()
def fs_env() -> ToolEnvironment:
    """multi_turn_base_0: GorillaFileSystem + TwitterAPI, with ``cp`` excluded."""
    task = get_suite(*STRICT).tasks("base")[0]
    return get_suite(*STRICT).make_env(task)


def _deep_state(env: ToolEnvironment) -> dict:
    return {k: copy.deepcopy(public_state(v)) for k, v in env.instances.items()}


REFUSED = [
    (ToolCall("_load_scenario", {"scenario": {}}), TOOL_NOT_AVAILABLE),
    (ToolCall("__init__", {}), TOOL_NOT_AVAILABLE),
    (ToolCall("__class__", {}), TOOL_NOT_AVAILABLE),
    (ToolCall("_navigate_to_directory", {"path": "/"}), TOOL_NOT_AVAILABLE),
    (ToolCall("rm_rf", {"path": "/"}), TOOL_NOT_AVAILABLE),
    (ToolCall("cp", {"source": "a", "destination": "b"}), TOOL_NOT_AVAILABLE),  # excluded
    (ToolCall("place_order", {}), TOOL_NOT_AVAILABLE),  # a class not involved in this task
    (ToolCall("cd", {"folder": 3}), INVALID_PARAMETERS),
    (ToolCall("cd", {}), INVALID_PARAMETERS),
    (ToolCall("cd", {"folder": "document", "force": True}), INVALID_PARAMETERS),
    (ToolCall("ls", {"a": "yes"}), INVALID_PARAMETERS),
    (ToolCall("tail", {"file_name": "x", "lines": 2.5}), INVALID_PARAMETERS),
    (ToolCall("tail", {"file_name": "x", "lines": True}), INVALID_PARAMETERS),
    (ToolCall("post_tweet", {"content": "hi", "tags": "#a"}), INVALID_PARAMETERS),
    (ToolCall("post_tweet", {"content": "hi", "tags": ["#a", 7]}), INVALID_PARAMETERS),
    (ToolCall("mkdir", ["temp"]), INVALID_PARAMETERS),  # type: ignore[arg-type]
]


@pytest.mark.parametrize(("call", "code"), REFUSED, ids=[c.name for c, _ in REFUSED])
def test_refused_call_is_a_tool_error_and_changes_nothing(
    fs_env: ToolEnvironment, call: ToolCall, code: str
) -> None:
    fs_env.execute(ToolCall("cd", {"folder": "document"}))  # some state that must survive
    before_json, before_objects = fs_env.state(), _deep_state(fs_env)
    result = fs_env.execute(call)
    assert not result.ok and result.value is None
    assert result.error.code == code
    assert call.name in result.error.message or code == INVALID_PARAMETERS
    assert fs_env.state() == before_json
    assert _deep_state(fs_env) == before_objects


def test_error_messages_say_what_is_wrong(fs_env: ToolEnvironment) -> None:
    wrong_type = fs_env.execute(ToolCall("cd", {"folder": 3})).error
    assert wrong_type.message == "cd arguments.folder must be of type string, got int 3"
    missing = fs_env.execute(ToolCall("mv", {"source": "a"})).error
    assert missing.message == "mv arguments: missing required parameter(s) destination"
    unknown = fs_env.execute(ToolCall("cd", {"folder": "x", "force": 1})).error
    assert unknown.message == "cd arguments: unknown parameter(s) force (allowed: folder)"
    absent = fs_env.execute(ToolCall("rm_rf", {})).error.message
    assert absent.startswith(
        "no tool named 'rm_rf' is available; available tools: authenticate_twitter, cat, "
    )


def test_tool_code_exception_becomes_execution_error() -> None:
    suite = get_suite("bfcl-gen")
    task = next(t for t in suite.tasks("train") if t.meta["involved_classes"] == ["TradingBot"])
    env = suite.make_env(task)
    env.execute(ToolCall("trading_login", {"username": "a", "password": "b"}))
    result = env.execute(ToolCall("get_transaction_history", {"start_date": "yesterday"}))
    assert result.error.code == TOOL_EXECUTION_ERROR
    assert result.error.message.startswith("ValueError: time data 'yesterday' does not match")


def test_backend_error_dict_stays_a_value(fs_env: ToolEnvironment) -> None:
    result = fs_env.execute(ToolCall("cd", {"folder": "no_such_dir"}))
    assert result.ok
    assert result.value == {"error": "cd: 'no_such_dir': No such file or directory"}


def test_arguments_are_copied_into_the_backend(fs_env: ToolEnvironment) -> None:
    tags = ["#a"]
    fs_env.execute(
        ToolCall("authenticate_twitter", {"username": "analyst_pro", "password": "Kj8#mP9$vL2"})
    )
    fs_env.execute(ToolCall("post_tweet", {"content": "x", "tags": tags, "mentions": []}))
    tags.append("#mutated-later")
    posted = fs_env.instances["TwitterAPI"].tweets[3]
    assert posted["tags"] == ["#a"]


def test_whitelist_matches_real_public_methods() -> None:
    for cls in BACKENDS:
        for tool in class_tools(cls):
            name = tool["function"]["name"]
            assert not name.startswith("_")
            method = getattr(backend_class(cls), name)
            params = set(inspect.signature(method).parameters) - {"self"}
            assert set(tool["function"]["parameters"]["properties"]) <= params, name


def test_crafted_task_cannot_expose_a_private_method() -> None:
    task = get_suite("bfcl").tasks("base")[0]
    private = {"type": "function", "function": {"name": "_load_scenario", "parameters": {}}}
    with pytest.raises(ValueError, match="no owning backend instance"):
        get_suite(*STRICT).make_env(Task(**{**task.__dict__, "tools": (*task.tools, private)}))


def test_bfcl_dialect_conversion() -> None:
    doc = {
        "type": "dict",
        "properties": {
            "n": {"type": "float", "description": "a number"},
            "pair": {"type": "tuple", "items": {"type": "integer"}},
            "opts": {"type": "dict", "properties": {"x": {"type": "any"}}},
            "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
        },
        "required": ["n"],
        "optional": ["mode"],
    }
    assert bfcl_to_json_schema(doc) == {
        "type": "object",
        "required": ["n"],
        "properties": {
            "n": {"type": "number", "description": "a number"},
            "pair": {"type": "array", "items": {"type": "integer"}},
            "opts": {"type": "object", "properties": {"x": {}}},
            "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
        },
    }


def test_value_checks() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "number"},
            "k": {"type": "integer"},
            "m": {"type": "string", "enum": ["a", "b"]},
        },
        "required": ["n"],
    }
    assert check_object({"n": 3}, schema) is None  # an int is a JSON number
    assert check_object({"n": 3.5, "k": 2, "m": "b"}, schema) is None
    assert check_object({"n": 1, "k": 2.0}, schema) == (
        "arguments.k must be of type integer, got float 2.0"
    )
    assert check_object({"n": True}, schema) == (
        "arguments.n must be of type number, got bool True"
    )
    assert check_object({"n": 1, "m": "c"}, schema) == (
        "arguments.m must be one of ['a', 'b'], got 'c'"
    )
    assert check_object({"n": 10**19}, schema) == (
        "arguments.n must be between -1e+18 and 1e+18, got 1e+19"
    )


def test_model_chosen_numbers_cannot_make_tool_code_run_forever() -> None:
    task = next(
        t for t in get_suite("bfcl").tasks("base") if "MathAPI" in t.meta["involved_classes"]
    )
    env = get_suite(*STRICT).make_env(task)
    huge = env.execute(ToolCall("power", {"base": 10, "exponent": 10**12}))
    assert huge.error.code == INVALID_PARAMETERS
    assert huge.error.message == (
        "power arguments.exponent must be between -100 and 100, got 1e+12"
    )
    precise = env.execute(ToolCall("logarithm", {"value": 8, "base": 2, "precision": 10**9}))
    assert precise.error.code == INVALID_PARAMETERS
    assert env.execute(ToolCall("power", {"base": 2, "exponent": 10})).value == {"result": 1024}


def test_state_snapshot_is_json_without_parent_cycles(fs_env: ToolEnvironment) -> None:
    state = fs_env.state()
    root = state["GorillaFileSystem"]["root"]
    assert root["name"] == "workspace"
    assert "parent" not in root["contents"]["document"]
    assert jsonable({3, 1, 2}) == [1, 2, 3]
    assert jsonable({1: (2, 3)}) == {"1": [2, 3]}


def test_suites_and_environments_implement_the_protocols() -> None:
    from envace_engine.environments import Environment, Suite, suite_names, whole_splits

    for name in suite_names():
        suite = get_suite(name)
        assert isinstance(suite, Suite) and suite.name == name
        task = suite.tasks(whole_splits(name)[0])[0]
        assert isinstance(suite.make_env(task), Environment)
    with pytest.raises(
        ValueError,
        match="unknown suite 'nope'; valid suites: toy, toy-library, bfcl, bfcl-gen, tau2",
    ):
        get_suite("nope")


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_NAMES = st.sampled_from(
    ["cd", "mv", "ls", "tail", "post_tweet", "_load_scenario", "__dict__", "cp", "echo", "rm"]
) | st.text(max_size=12)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=_NAMES,
    args=st.dictionaries(
        st.sampled_from(
            ["folder", "source", "destination", "file_name", "lines", "a", "content", "tags", "x"]
        ),
        _JSON,
        max_size=3,
    ),
)
def test_any_model_call_returns_a_result_and_refusals_change_nothing(
    fs_env: ToolEnvironment, name: str, args: dict
) -> None:
    before = fs_env.state()
    result = fs_env.execute(ToolCall(name, args))
    assert result.ok or result.error.code in (
        TOOL_NOT_AVAILABLE,
        INVALID_PARAMETERS,
        TOOL_EXECUTION_ERROR,
    )
    if not result.ok and result.error.code != TOOL_EXECUTION_ERROR:
        assert fs_env.state() == before
    json.dumps(result.value)  # whatever came back is JSON for the tool message
