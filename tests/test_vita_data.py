"""VitaBench data carried in the project: checksums, the task schema, hidden fields, prompts.

Expected values come from the data files themselves (read by eye, as each comment says) and from
docs/vitabench.md; nothing here depends on sampled numbers.
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from envace_engine.environments.vita import dataset as data
from envace_engine.environments.vita.env import make_env
from envace_engine.environments.vita.task import build_task
from envace_engine.types import TaskKey, ToolCall

DATA = Path(data.__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[1]
HIDDEN_SHOP = {"category", "shop_type", "target_reason"}
HIDDEN_PRODUCT = {"product_type"}
DROPPED = {"description", "special_note", "products_preview", "business_hours", "field"}


def _source_rows() -> dict[str, tuple[int, str]]:
    """file -> (bytes, sha256) from SOURCE.md's table."""
    rows = {}
    for line in (DATA / "SOURCE.md").read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and re.fullmatch(r"[0-9a-f]{64}", cells[4]):
            rows[cells[0]] = (int(cells[2]), cells[4])
    return rows


def test_every_data_file_matches_source_md() -> None:
    rows = _source_rows()
    files = {
        p.relative_to(DATA).as_posix()
        for p in DATA.rglob("*")
        if p.is_file() and p.suffix != ".pyc"
    }
    assert files - {"SOURCE.md"} == set(rows)  # every file listed, nothing unlisted
    for name, (size, sha256) in rows.items():
        blob = (DATA / name).read_bytes()
        assert len(blob) == size, name
        assert hashlib.sha256(blob).hexdigest() == sha256, name


def test_the_build_ships_every_data_file() -> None:
    # setuptools copies package data by the patterns of [tool.setuptools.package-data]; every
    # suffix under data/ must be among them (the prompts are YAML).
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = config["tool"]["setuptools"]["package-data"]["*"]
    for path in DATA.rglob("*"):
        if path.is_file():
            assert any(path.match(p) for p in patterns), path.name


@pytest.mark.parametrize(("domain", "language"), [("delivery", "zh"), ("delivery", "en")])
def test_delivery_files_have_100_tasks_with_the_same_ids(domain: str, language: str) -> None:
    # spec §1: 100 tasks per file; zh and en share ids in the same order.
    specs = data.task_specs(domain, language)
    assert len(specs) == 100
    assert [s.id for s in specs] == [s.id for s in data.task_specs("delivery", "zh")]


def test_instore_file_has_100_tasks() -> None:
    assert len(data.task_specs("instore", "en")) == 100


def test_unknown_domain_or_language_is_refused() -> None:
    with pytest.raises(ValueError, match="valid domains: delivery, instore"):
        data.task_specs("ota", "en")
    with pytest.raises(ValueError, match="valid languages: en"):
        data.task_specs("instore", "zh")


def test_task_10711001_frozen_time_user_and_store() -> None:
    # From delivery/tasks_en.json, task 10711001: time, the one user, one store, no orders.
    spec = data.task_spec("delivery", "en", "10711001")
    db = data.agent_db(spec)
    assert db["time"] == "2025-06-21 11:20:00"
    assert db["user_id"] == "U000001"
    assert list(db["stores"]) == ["S85277471199200385_S98778"]
    assert db["orders"] == {}
    # A store's attributes list [] is joined to "" and int prices become floats (upstream's
    # models): the first dish costs 25 in the file.
    dish = db["stores"]["S85277471199200385_S98778"]["products"][0]
    assert (dish["attributes"], dish["price"]) == ("", 25.0)


def test_time_weekday_greeting_and_prompts_per_language() -> None:
    # 2025-06-21 is a Saturday (2025-06-01 was a Sunday; +20 days = Saturday).
    for language, weekday, greeting in [
        ("en", "Saturday", "Hello, how can I help you?"),
        ("zh", "星期六", "你好，请问需要什么服务？"),
    ]:
        spec = data.task_spec("delivery", language, "10711001")
        task = build_task("delivery", language, spec, opening="hi")
        assert task.id == f"vita-delivery/{language}/10711001"
        assert task.meta["time"] == f"2025-06-21 11:20:00 {weekday}"
        assert f"2025-06-21 11:20:00 {weekday}" in task.meta[TaskKey.POLICY]
        assert task.meta["greeting"] == greeting == make_env(task).greeting
        assert spec.instructions in task.meta[TaskKey.USER_SYSTEM]
        assert spec.instructions not in task.meta[TaskKey.POLICY]


def test_rubrics_skip_exact_duplicates_in_order() -> None:
    # Task 30711001 (en): one state with 3 rubrics, and overall_rubrics repeat the same 3
    # strings exactly -> 3 rubrics, in the state's order.
    spec = data.task_spec("delivery", "en", "30711001")
    state = spec.evaluation_criteria.expected_states[0].state_rubrics
    assert spec.evaluation_criteria.overall_rubrics == state
    assert data.rubrics(spec) == tuple(state)


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield str(key)
            yield from _keys(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys(inner)


def _instore_specs() -> list[data.InstoreTaskSpec]:
    specs = [s for s in data.task_specs("instore", "en") if isinstance(s, data.InstoreTaskSpec)]
    assert len(specs) == 100
    return specs


def _hidden_texts() -> list[str]:
    texts = []
    for spec in _instore_specs():
        for shop in spec.environment.shops.values():
            texts += [t for t in (shop.target_reason, shop.special_note) if t]
    return texts


def test_hidden_fields_are_parsed_but_never_in_the_agents_database() -> None:
    specs = _instore_specs()
    # The annotations are there on the parsed models (evaluation-side code may read them) ...
    shop_types = {s.shop_type for t in specs for s in t.environment.shops.values()}
    assert {"target", "distraction"} <= shop_types
    # ... and no key of them is in any task's database, shops and products alike.
    for spec in specs:
        db = data.agent_db(spec)
        keys = set(_keys(db["shops"]))
        assert not keys & (HIDDEN_SHOP | HIDDEN_PRODUCT | DROPPED), spec.id
        assert "product_type" not in set(_keys(db["orders"])), spec.id
        assert "order_time" not in set(_keys(db["orders"])), spec.id


def test_hidden_fields_never_reach_the_agent_through_task_or_tools() -> None:
    # 10826054 has "product_type": "target" inside a pre-existing order's product (read in
    # instore/tasks_en.json); 10826012 has two shops with a target_reason.
    texts = _hidden_texts()
    assert texts
    for spec in data.task_specs("instore", "en"):
        task = build_task("instore", "en", spec, opening="hi")
        seen = json.dumps([task.initial_state, task.tools, task.meta[TaskKey.POLICY]])
        env = make_env(task)
        for name, args in [
            ("instore_shop_search_recommend", {"keywords": ["a"]}),
            ("instore_product_search_recommend", {"keywords": ["a"]}),
            ("get_user_all_orders", {}),
        ]:
            result = env.execute(ToolCall(name, args))
            assert result.ok
            seen += str(result.value)
        for word in ("shop_type", "target_reason", "product_type", "'category'"):
            assert word not in seen, (spec.id, word)
        assert not any(text in seen for text in texts), spec.id


def test_prompts_and_tool_descriptions_load_in_both_languages() -> None:
    assert "{time}" in data.prompt("agent_system_prompt", "en")
    assert "{time}" in data.prompt("agent_system_prompt", "zh")
    kits = data.tool_descriptions()
    # tool_descriptions.json: 8 generic, 12 delivery, 16 instore (and 30 OTA, unused here).
    assert [len(kits[k]["english"]) for k in ("toolkit", "delivery", "instore", "ota")] == [
        8,
        12,
        16,
        30,
    ]
