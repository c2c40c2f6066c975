"""The VitaBench environment as the engine sees it: protocol, schemas, errors, the 10-error end.

Expected values come from tool_descriptions.json, the task files and docs/vitabench.md, as the
comments say.
"""

from __future__ import annotations

from typing import Any

import pytest

from envace_engine.environments.base import Environment
from envace_engine.environments.vita import dataset as data
from envace_engine.environments.vita.env import MAX_ERRORS, VitaEnvironment, domain, make_env
from envace_engine.environments.vita.task import build_task
from envace_engine.types import Task, ToolCall

DELIVERY_TOOLS = [
    "delivery_distance_to_time",
    "get_delivery_store_info",
    "get_delivery_product_info",
    "delivery_store_search_recommend",
    "delivery_product_search_recommend",
    "create_delivery_order",
    "pay_delivery_order",
    "get_delivery_order_status",
    "cancel_delivery_order",
    "modify_delivery_order",
    "search_delivery_orders",
    "get_delivery_order_detail",
]
GENERIC_TOOLS = [
    "longitude_latitude_to_distance",
    "weather",
    "address_to_longitude_latitude",
    "get_date_holiday_info",
    "get_holiday_date",
    "get_user_historical_behaviors",
    "get_user_all_orders",
    "get_nearby",
]


def task_for(dom: str, language: str, task_id: str) -> Task:
    """The engine task of one VitaBench task."""
    return build_task(dom, language, data.task_spec(dom, language, task_id), opening="hi")


def names(env: VitaEnvironment) -> list[str]:
    """The tool names the agent is offered, in order."""
    return [t["function"]["name"] for t in env.tools()]


def schema(env: VitaEnvironment, name: str) -> dict[str, Any]:
    """One tool's function schema."""
    return next(t["function"] for t in env.tools() if t["function"]["name"] == name)


def test_it_is_an_engine_environment_with_the_domains_tools() -> None:
    env = make_env(task_for("delivery", "en", "10711001"))
    assert isinstance(env, Environment)
    # Upstream's order: the domain's own tools (12 delivery, 16 in-store), then the 8 generic.
    assert names(env) == DELIVERY_TOOLS + GENERIC_TOOLS
    instore = make_env(task_for("instore", "en", "10826004"))
    assert len(names(instore)) == 16 + 8 and names(instore)[16:] == GENERIC_TOOLS
    assert env.task.tools == tuple(env.tools())
    assert domain("delivery", "en").writes("create_delivery_order")
    assert not domain("delivery", "en").writes("get_nearby")


def test_schemas_carry_upstreams_texts_in_the_tasks_language() -> None:
    env = make_env(task_for("delivery", "en", "10711001"))
    create = schema(env, "create_delivery_order")
    # tool_descriptions.json, delivery/english/create_delivery_order: description, then the
    # pre- and postconditions as upstream's schema shows them.
    assert create["description"] == (
        "Create delivery order, only supports single store orders, single store can order "
        "multiple food items\n\nPreconditions:\n    - In delivery scenario, determine unique "
        "store id and one or more food ids, determine user dietary restrictions and reflect in "
        "order\nPostconditions:\n    - Return order information, ask user to confirm payment"
    )
    params = create["parameters"]
    assert params["required"] == [
        "user_id",
        "store_id",
        "product_ids",
        "product_cnts",
        "address",
        "dispatch_time",
    ]
    # Upstream documents product_ids as "food_ids"; our schema gives it that description.
    assert params["properties"]["product_ids"] == {
        "type": "array",
        "items": {"type": "string"},
        "description": "Food id list",
    }
    assert params["properties"]["note"]["default"] == ""
    info = schema(env, "get_delivery_product_info")["parameters"]["properties"]["product_id"]
    assert info["description"] == "Food id"
    zh = make_env(task_for("delivery", "zh", "10711001"))
    assert schema(zh, "weather")["description"].startswith(
        "查询指定地址在date_start到date_end期间的天气信息"
    )


def test_bad_calls_are_error_results_that_change_nothing() -> None:
    env = make_env(task_for("delivery", "en", "10711001"))
    before = repr(env.state())
    unknown = env.execute(ToolCall("book_flight", {}))
    assert unknown.error is not None and unknown.error.code == "TOOL_NOT_AVAILABLE"
    missing = env.execute(ToolCall("pay_delivery_order", {}))
    assert missing.error is not None and missing.error.code == "INVALID_PARAMETERS"
    assert "missing required parameter(s) order_id" in missing.error.message
    typed = env.execute(ToolCall("get_nearby", {"longitude": "1", "latitude": 2, "range": 3}))
    assert typed.error is not None and typed.error.code == "INVALID_PARAMETERS"
    extra = env.execute(ToolCall("get_user_all_orders", {"user_id": "U000001"}))
    assert extra.error is not None and extra.error.code == "INVALID_PARAMETERS"
    assert env.errors == 4 and repr(env.state()) == before


def test_null_for_an_optional_none_parameter_means_left_out() -> None:
    env = make_env(task_for("instore", "en", "10826247"))
    listed = env.execute(ToolCall("search_instore_book", {"user_id": "U012408"}))
    nulled = env.execute(ToolCall("search_instore_book", {"user_id": "U012408", "book_id": None}))
    assert listed.ok and nulled.ok and listed.value == nulled.value


def test_ten_error_results_end_the_episode_refusals_do_not_count() -> None:
    env = make_env(task_for("delivery", "en", "10711001"))
    for _ in range(20):  # a refusal (upstream's assert) is an ordinary answer
        assert env.execute(ToolCall("pay_delivery_order", {"order_id": ""})).ok
    assert env.errors == 0 and not env.too_many_errors
    miss = ToolCall("address_to_longitude_latitude", {"address": "###"})
    for _ in range(MAX_ERRORS - 1):
        assert not env.execute(miss).ok
    assert not env.too_many_errors
    assert not env.execute(miss).ok
    assert env.errors == MAX_ERRORS == 10 and env.too_many_errors


def test_every_episode_gets_its_own_database_and_ids_repeat() -> None:
    task = task_for("delivery", "en", "10711001")
    # Task 10711001: one store, whose first dish is S26110520013660896_P88296; the user's
    # work address is the one gazetteer place (delivery/tasks_en.json).
    order = ToolCall(
        "create_delivery_order",
        {
            "user_id": "U000001",
            "store_id": "S85277471199200385_S98778",
            "product_ids": ["S26110520013660896_P88296"],
            "product_cnts": [1],
            "address": "Yunnan University Affiliated Hospital",
            "dispatch_time": "2025-06-21 12:00:00",
        },
    )
    first, second = make_env(task), make_env(task)
    assert first.execute(order).value == second.execute(order).value  # a shadow agrees
    assert len(first.state()["orders"]) == 1
    assert task.initial_state["orders"] == {} and make_env(task).state()["orders"] == {}


def test_tasks_with_inconsistent_references_still_run() -> None:
    # 10826234's pre-existing orders name shops that are not in its database (read in
    # instore/tasks_en.json): an order's shop is only an id, so the order still lists and
    # cancels.
    task = task_for("instore", "en", "10826234")
    env = make_env(task)
    assert "S17567841558014419_I00002" not in task.initial_state["shops"]
    user = task.initial_state["user_id"]
    listed = env.execute(ToolCall("get_instore_orders", {"user_id": user}))
    assert listed.ok and "S17567841558014419_I00002" in listed.value
    order_id = next(iter(task.initial_state["orders"]))
    cancelled = env.execute(ToolCall("instore_cancel_order", {"order_id": order_id}))
    assert cancelled.ok and env.errors == 0
    # 20711002 keys a store by an id other than the one it carries (upstream's data): look-ups
    # go by the key, as upstream's do.
    delivery = make_env(task_for("delivery", "en", "20711002"))
    keyed = delivery.execute(
        ToolCall("get_delivery_store_info", {"store_id": "S10884602254755805_S86671"})
    )
    assert keyed.ok and "store_id=S15949154785780736_S01374" in keyed.value


def test_unknown_domain_or_language_in_a_task_is_refused() -> None:
    task = task_for("delivery", "en", "10711001")
    bad = Task(
        task.id,
        task.suite,
        task.user_turns,
        task.tools,
        task.initial_state,
        meta={**task.meta, "language": "fr"},
    )
    with pytest.raises(ValueError, match="valid languages: zh, en"):
        make_env(bad)
