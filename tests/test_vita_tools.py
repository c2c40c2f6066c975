"""VitaBench generic and delivery tools on the real carried data (docs/vitabench.md, spec §4).

Every expected value was worked out by hand from the task files and the spec, as each comment
says. Fuzzy rankings are pinned only where they follow from the matching rule without
computing a score: thefuzz lower-cases both sides and turns every non-alphanumeric character
into a space, and a document that contains the processed query verbatim scores 100, the
maximum; ties keep document order.
"""

from __future__ import annotations

from typing import Any

import pytest

from envace_engine.environments.vita import dataset as data
from envace_engine.environments.vita.env import VitaEnvironment, make_env
from envace_engine.environments.vita.task import build_task
from envace_engine.types import ToolCall, ToolResult

# Task G0721003 (delivery/tasks_en.json): 9 stores in Wuxi, "now" 2025-10-16 10:52:13, user
# U000056 whose one gazetteer place is the co-working space below, at (120.297362, 31.574308).
TASK = "G0721003"
USER = "U000056"
HOME = (
    "Co-working Space, 5th Floor, Center 66, No. 139 Renmin Middle Road, Liangxi District, "
    "Wuxi City, Jiangsu Province"
)
SONGHE = "S21687429664650680_S32362"
KOI = "S10892011637579176_S44408"
YES_LEMON = "S93830810283846794_S56337"
ZHUYIN = "S28127951915502215_S97759"  # at (120.296866, 31.570563)
SUOKOU = "S22066242611360822_S03108"
BEEF_NOODLES = "S14100693540657712_P57482"  # Zhuyin's only dish, price 42
TEA = "S74469906752994471_P47610"  # KOI PLUS's only dish, price 27


def env_for(task_id: str = TASK, language: str = "en") -> VitaEnvironment:
    """A fresh environment for a delivery task."""
    spec = data.task_spec("delivery", language, task_id)
    return make_env(build_task("delivery", language, spec, opening="hi"))


def call(env: VitaEnvironment, name: str, **arguments: Any) -> ToolResult:
    """Run one call."""
    return env.execute(ToolCall(name, arguments))


def value(env: VitaEnvironment, name: str, **arguments: Any) -> Any:
    """Run one call that must not be an error result; its value."""
    result = call(env, name, **arguments)
    assert result.ok, result.error
    return result.value


def ids(text: str, key: str = "store_id") -> list[str]:
    """The ids in a search answer, one provider or product per line."""
    return [line.split(f"{key}=")[1].split(",")[0] for line in text.splitlines()]


# ---------------------------------------------------------------- distances and times


@pytest.mark.parametrize(
    ("a", "b", "metres"),
    [
        ((1.0, 2.0), (1.0, 2.0), 0.0),  # the same point: 0 by definition
        # 0.1° of latitude on one meridian: 6,371,000 m × 0.1 × π/180 = 11,119.49 m -> 11119.
        ((120.0, 25.0), (120.0, 25.1), 11119.0),
        # 1° of longitude on the equator: 6,371,000 × π/180 = 111,194.93 m -> 111195.
        ((0.0, 0.0), (1.0, 0.0), 111195.0),
        # The co-working space to Zhuyin: Δlat 0.003745° -> 416.43 m north-south; Δlon
        # 0.000496° × cos(31.5724°) = 0.85198 -> 46.99 m east-west; √(416.43² + 46.99²) =
        # 419.07 -> 419.
        ((120.297362, 31.574308), (120.296866, 31.570563), 419.0),
    ],
)
def test_distance_is_haversine_in_whole_metres(
    a: tuple[float, float], b: tuple[float, float], metres: float
) -> None:
    names = ("longitude1", "latitude1", "longitude2", "latitude2")
    arguments = dict(zip(names, (*a, *b), strict=True))
    assert value(env_for(), "longitude_latitude_to_distance", **arguments) == metres


@pytest.mark.parametrize(
    ("metres", "minutes"),
    [
        (0, 25.0),  # 25 + 0
        (419.0, 28.0),  # 25 + 419 × 0.00651 = 27.728 -> 28
        (1000, 32.0),  # 25 + 6.51 = 31.51 -> 32
        (1999.9, 38.0),  # int() first: 25 + 1999 × 0.00651 = 38.013 -> 38
    ],
)
def test_delivery_time_from_distance(metres: float, minutes: float) -> None:
    assert value(env_for(), "delivery_distance_to_time", distance=metres) == minutes


def test_nearby_includes_the_boundary() -> None:
    env = env_for()
    # Songhe and KOI PLUS sit at exactly the co-working space's coordinates (distance 0);
    # Zhuyin is 419 m away (above); every other store is more than 500 m away.
    near = value(env, "get_nearby", longitude=120.297362, latitude=31.574308, range=419)
    assert ids(near) == [SONGHE, KOI, ZHUYIN]
    near = value(env, "get_nearby", longitude=120.297362, latitude=31.574308, range=418)
    assert ids(near) == [SONGHE, KOI]
    assert value(env, "get_nearby", longitude=0.0, latitude=0.0, range=10) == (
        "No search results found"
    )


# ---------------------------------------------------------------- fuzzy search


def test_store_search_ranks_verbatim_matches_first_in_file_order() -> None:
    env = env_for()
    # "Center 66" occurs (processed: "center 66") in exactly three store documents (name +
    # tags): Songhe "(Wuxi Center 66 Store)", KOI PLUS "(Center 66 Store)" and Suokou
    # "(Center 66 Store)", in that file order. Nothing is cut off: all 9 stores come back.
    found = ids(value(env, "delivery_store_search_recommend", keywords=["Center 66"]))
    assert found[:3] == [SONGHE, KOI, SUOKOU]
    assert len(found) == 9 == len(set(found))
    # Only "Yes Lemon · Handmade Lemon Tea" contains "lemon tea".
    found = ids(value(env, "delivery_store_search_recommend", keywords=["Lemon Tea"]))
    assert found[0] == YES_LEMON


def test_keywords_are_joined_with_nothing_between() -> None:
    env = env_for()
    # ["Center", " 66"] joins to "Center 66": the same query, the same answer.
    one = value(env, "delivery_store_search_recommend", keywords=["Center 66"])
    assert value(env, "delivery_store_search_recommend", keywords=["Center", " 66"]) == one


def test_product_search_ranks_dishes_by_store_name_name_and_tags() -> None:
    env = env_for()
    # "vegetarian" occurs in two dish documents: Songhe's "Ruyi Vegetarian Noodles" and
    # Suokou's "Signature Vegetarian Soup Rice Noodles", in that registry (file) order.
    found = ids(
        value(env, "delivery_product_search_recommend", keywords=["Vegetarian"]), "product_id"
    )
    assert found[:2] == ["S20111038835749649_P89250", "S31430053761255699_P16182"]
    assert len(found) == 10  # Xiao Wu-Yue has two dishes, every other store one


def test_search_refusals() -> None:
    env = env_for()
    assert value(env, "delivery_store_search_recommend", keywords=[]) == "Keywords cannot be empty"
    assert value(env, "delivery_product_search_recommend", keywords=["a", " "]) == (
        "All keywords must be non-empty strings"
    )
    env.world.db["stores"] = {}  # a task without stores
    assert value(env, "delivery_store_search_recommend", keywords=["a"]) == "No stores available"
    assert env.errors == 0  # refusals are ordinary answers


# ---------------------------------------------------------------- weather, places, holidays


def test_weather_lines_and_misses() -> None:
    env = env_for()
    # The task has one day of weather: Wuxi City, 2025-10-16, sunny, 17~25 °C, humidity 64.
    # "Wuxi" is a substring of "wuxi city": score 100 ≥ 50.
    assert value(
        env, "weather", address="Wuxi", date_start="2025-10-16", date_end="2025-10-17"
    ) == (
        "city: Wuxi City, weather: sunny, datetime: 2025-10-16, temperature: 17.0~25.0, "
        "humidity: 64.0"
    )
    assert value(
        env, "weather", address="Wuxi", date_start="2025-10-17", date_end="2025-10-18"
    ) == ("No weather information found for Wuxi City between 2025-10-17 and 2025-10-18")
    assert value(env, "weather", address="Wuxi", date_start="16/10/2025", date_end="x") == (
        "Invalid date_start format. Expected yyyy-mm-dd, got: 16/10/2025"
    )
    # "###" is processed to an empty string: every score is 0 < 50, an error result.
    missed = call(env, "weather", address="###", date_start="2025-10-16", date_end="2025-10-16")
    assert missed.error is not None
    assert missed.error.message == "Weather information not found for ###"


def test_geocoding_matches_known_places_only() -> None:
    env = env_for()
    assert value(env, "address_to_longitude_latitude", address=HOME) == [120.297362, 31.574308]
    # Every place of the task has 80 characters or more, so a 4-character query has a plain
    # ratio of at most 100 × 2 × 4 / (4 + 80) = 9.5 < 20: refused although it is a substring.
    assert min(len(p) for p in env.world.places) >= 80
    missed = call(env, "address_to_longitude_latitude", address="Wuxi")
    assert missed.error is not None
    assert missed.error.message == "Longitude and latitude not found for address Wuxi"
    assert value(env, "address_to_longitude_latitude", address=" ") == "Address cannot be empty"


@pytest.mark.parametrize(
    ("language", "date", "answer"),
    [
        # China's statutory holidays: National Day on 1 October, Labour Day on 1 May; 21 June
        # 2025 is none (the Dragon Boat Festival fell on 31 May that year).
        ("en", "2025-10-01", "National Day"),
        ("zh", "2025-10-01", "国庆节"),
        ("en", "2025-05-01", "Labor Day"),
        ("zh", "2025-05-01", "劳动节"),
        ("en", "2025-06-21", "Date 2025-06-21 is not a holiday"),
        ("en", "2025/10/01", "Date format error, should be yyyy-mm-dd, actual: 2025/10/01"),
    ],
)
def test_holiday_of_a_date(language: str, date: str, answer: str) -> None:
    env = env_for("10711001", language)
    assert value(env, "get_date_holiday_info", date=date) == answer


@pytest.mark.parametrize(
    ("language", "year", "name", "answer"),
    [
        # From holiday_dates.json: the 2025 table has Mid-Autumn Festival on 2025-10-06;
        # "Mid-Autumn" is a substring of that name (score 100 ≥ 80).
        ("en", "2025", "Mid-Autumn", "2025-10-06"),
        ("zh", "2025", "中秋", "2025-10-06"),
        ("en", "2023", "Father's Day", "2023-06-18"),
        # The table covers 2023-2025 only.
        ("en", "2026", "National Day", "Holiday data for year 2026 not found"),
        # 80 needs about 7 of the 9 letters of "christmas" in order within one window; the
        # 2024 names share a few at most ("festival" gives s-t-a): not found.
        ("en", "2024", "Christmas", "Holiday named 'Christmas' not found in year 2024"),
        ("en", "2025", " ", "Holiday name cannot be empty"),
    ],
)
def test_date_of_a_holiday(language: str, year: str, name: str, answer: str) -> None:
    env = env_for("10711001", language)
    assert value(env, "get_holiday_date", year=year, holiday_name=name) == answer


# ---------------------------------------------------------------- the order life cycle


def test_delivery_order_life_cycle() -> None:
    env = env_for()
    created = value(
        env,
        "create_delivery_order",
        user_id=USER,
        store_id=ZHUYIN,
        product_ids=[BEEF_NOODLES],
        product_cnts=[2],
        address=HOME,
        dispatch_time="2025-10-16 12:00:00",
        attributes=["Extra spicy"],
    )
    (order_id,) = env.state()["orders"]
    order = env.state()["orders"][order_id]
    assert order_id.startswith("OT") and len(order_id) == 12
    # 419 m -> 28 minutes (above): delivered at 12:28; 2 × 42.0 = 84.0; created "now".
    assert (order["shipping_time"], order["delivery_time"]) == (28.0, "2025-10-16 12:28:00")
    assert (order["total_price"], order["status"]) == (84.0, "unpaid")
    assert order["create_time"] == order["update_time"] == "2025-10-16 10:52:13"
    assert "attributes=Extra spicy, quantity=2, price=42.0" in created
    # Upstream's registry quirk, kept: the dish now reads as the ordered copy.
    info = value(env, "get_delivery_product_info", product_id=BEEF_NOODLES)
    assert "attributes=Extra spicy, quantity=2" in info
    assert value(env, "get_delivery_order_status", order_id=order_id) == (
        f"Order {order_id} status: unpaid"
    )
    assert order_id in value(env, "search_delivery_orders", user_id=USER)
    assert value(env, "pay_delivery_order", order_id=order_id) == "Payment successful"
    assert value(env, "pay_delivery_order", order_id=order_id) == (
        f"Order {order_id} is not in `unpaid` status. Current status: paid"
    )
    assert value(env, "search_delivery_orders", user_id=USER) == "No delivery orders available"
    assert value(env, "modify_delivery_order", order_id=order_id, note="no cilantro") == (
        f"Order {order_id} has been modified."
    )
    assert "note:no cilantro, status:paid" in value(
        env, "get_delivery_order_detail", order_id=order_id
    )
    assert value(env, "cancel_delivery_order", order_id=order_id) == (
        f"Order {order_id} has been cancelled."
    )
    assert value(env, "cancel_delivery_order", order_id=order_id) == (
        f"Order {order_id} is already cancelled"
    )
    assert value(env, "modify_delivery_order", order_id=order_id, note="x") == (
        f"Cannot modify order {order_id} as it is already cancelled"
    )
    assert env.errors == 0


def test_an_order_next_door_ships_in_25_minutes() -> None:
    env = env_for()
    # KOI PLUS is at the co-working space's coordinates: 0 m -> 25 minutes; 3 × 27.0 = 81.0.
    value(
        env,
        "create_delivery_order",
        user_id=USER,
        store_id=KOI,
        product_ids=[TEA],
        product_cnts=[3],
        address=HOME,
        dispatch_time="2025-10-16 10:52:13",
    )
    (order,) = env.state()["orders"].values()
    assert (order["delivery_time"], order["total_price"]) == ("2025-10-16 11:17:13", 81.0)
    assert order["products"][0]["attributes"] == ""  # no attributes given


def test_pre_existing_order_renders_its_raw_products() -> None:
    # Task 10716001 holds order 10716001O01 (paid, one product as a plain dict, no shipping
    # time) of user U000049, read from delivery/tasks_en.json.
    env = env_for("10716001")
    assert value(env, "get_delivery_order_detail", order_id="10716001O01") == (
        "Order(order_id:10716001O01, order_type:delivery, user_id:U000049, "
        "store_id:S30117605823859936_S63333, dispatch_time:, shipping_time:None, "
        "delivery_time:, total_price:38.9, create_time:2024-08-19 17:30:00, "
        "update_time:2024-08-19 17:30:00, note:, status:paid, products:[{'product_id': "
        "'S52869129511178636_P87490', 'price': 38.9, 'quantity': 1, 'attributes': ''}])"
    )
    assert value(env, "search_delivery_orders", user_id="U000049", status="paid") == (
        "Order(order_id:10716001O01, order_type:delivery, user_id:U000049, "
        "store_id:S30117605823859936_S63333, total_price:38.9, create_time:2024-08-19 17:30:00, "
        "update_time:2024-08-19 17:30:00, status:paid)"
    )
    assert value(env, "cancel_delivery_order", order_id="10716001O01") == (
        "Order 10716001O01 has been cancelled."
    )


# ---------------------------------------------------------------- every error branch


def _order_args(**changes: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "user_id": USER,
        "store_id": ZHUYIN,
        "product_ids": [BEEF_NOODLES],
        "product_cnts": [1],
        "address": HOME,
        "dispatch_time": "2025-10-16 12:00:00",
    }
    return {**args, **changes}


@pytest.mark.parametrize(
    ("changes", "answer"),
    [
        ({"user_id": ""}, "User ID cannot be empty"),
        ({"user_id": "U000001"}, "User ID does not match"),
        ({"store_id": "S0"}, "Store S0 not found"),
        ({"address": ""}, "Location  is empty"),
        ({"product_cnts": [1, 1]}, "product_cnts [1, 1] list is invalid"),
        ({"product_cnts": [0]}, "product_cnts [0] list is invalid"),
        (
            {"dispatch_time": "2025-10-16 12:00"},
            "dispatch_time 2025-10-16 12:00 time format is invalid, yyyy-mm-dd HH:MM:SS required",
        ),
        (
            {"dispatch_time": "2025-10-16 10:52:12"},  # one second before "now"
            "dispatch_time 2025-10-16 10:52:12 must be in the future",
        ),
    ],
)
def test_order_refusals_are_ordinary_answers_and_change_nothing(
    changes: dict[str, Any], answer: str
) -> None:
    env = env_for()
    assert value(env, "create_delivery_order", **_order_args(**changes)) == answer
    assert env.state()["orders"] == {} and env.errors == 0


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"product_ids": ["P0"]}, "P0 not found"),
        ({"address": "Wuxi"}, "Longitude and latitude not found for address Wuxi"),
    ],
)
def test_order_failures_are_error_results(changes: dict[str, Any], message: str) -> None:
    env = env_for()
    result = call(env, "create_delivery_order", **_order_args(**changes))
    assert result.error is not None and result.error.message == message
    assert result.error.code == "TOOL_EXECUTION_ERROR"
    assert env.state()["orders"] == {} and env.errors == 1


def test_unknown_ids_answer_upstreams_error_texts() -> None:
    env = env_for()
    for name in (
        "pay_delivery_order",
        "get_delivery_order_status",
        "cancel_delivery_order",
        "get_delivery_order_detail",
    ):
        assert value(env, name, order_id="OT0") == "Error: Order OT0 not found"
    assert value(env, "modify_delivery_order", order_id="OT0", note="") == (
        "Error: Order OT0 not found"
    )
    assert value(env, "get_delivery_store_info", store_id="S0") == "Error: Store S0 not found"
    assert value(env, "get_delivery_product_info", product_id="P0") == "Error: P0 not found"
    assert value(env, "get_delivery_store_info", store_id="") == "Store ID cannot be empty"
    assert value(env, "pay_delivery_order", order_id="") == "Order ID cannot be empty"
    env.world.db["orders"]["OI1"] = {"order_id": "OI1", "order_type": "instore", "status": "paid"}
    assert value(env, "pay_delivery_order", order_id="OI1") == (
        "Error: Order OI1 is not a delivery order"
    )
    assert value(env, "search_delivery_orders", user_id="x") == "User ID does not match"
    assert env.errors == 0


def test_user_with_no_orders_is_told_so() -> None:
    env = env_for()
    assert value(env, "get_user_all_orders") == "User currently has no order information"
    assert value(env, "get_user_historical_behaviors").startswith("{'user id': 'U000056'")
