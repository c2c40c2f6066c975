"""τ² tools, branch by branch: every refusal is an error result and leaves the database exactly
as it was (canonical hash unchanged); successful writes do what docs/tasks.md says, quirks
included. Real tool code on real copies of the shipped databases."""

from __future__ import annotations

import json
from typing import Any

import pytest

from envace_engine.environments.tau2 import mock
from envace_engine.environments.tau2.airline import _next_day
from envace_engine.environments.tau2.env import (
    INVALID_PARAMETERS,
    TOOL_EXECUTION_ERROR,
    TOOL_NOT_AVAILABLE,
    Tau2Environment,
    make_env,
)
from envace_engine.environments.tau2.tools import Tau2Error
from envace_engine.types import Task, ToolCall


def _env(domain: str) -> Tau2Environment:
    task = Task("t", f"tau2-{domain}", ("hi",), (), {}, meta={"domain": domain})
    return make_env(task)


@pytest.fixture
def air() -> Tau2Environment:
    return _env("airline")


@pytest.fixture
def shop() -> Tau2Environment:
    return _env("retail")


def ok(env: Tau2Environment, name: str, **args: Any) -> Any:
    result = env.execute(ToolCall(name, args))
    assert result.ok, result.error
    return result.value


def refused(
    env: Tau2Environment, name: str, args: Any, match: str, code: str = TOOL_EXECUTION_ERROR
) -> None:
    """The call is an error with ``code`` whose message holds ``match``; nothing changed."""
    before = env.state_hash()
    result = env.execute(ToolCall(name, args))
    assert result.error is not None and result.value is None, result.value
    assert result.error.code == code, result.error
    assert match in result.error.message, result.error.message
    assert env.state_hash() == before


# -- dispatch (shared by every domain) ----------------------------------------------------------


def test_dispatch_refuses_unknown_tools_and_bad_arguments(air: Tau2Environment) -> None:
    refused(air, "drop_tables", {}, "Tool 'drop_tables' not found", TOOL_NOT_AVAILABLE)
    refused(air, "__init__", {}, "not found", TOOL_NOT_AVAILABLE)
    refused(
        air, "get_user_details", {}, "missing required parameter(s) user_id", INVALID_PARAMETERS
    )
    refused(air, "get_user_details", ["x"], "must be a JSON object", INVALID_PARAMETERS)
    refused(
        air, "get_user_details", {"user_id": "a", "x": 1}, "unknown parameter", INVALID_PARAMETERS
    )
    refused(air, "get_user_details", {"user_id": 7}, "must be of type string", INVALID_PARAMETERS)
    bad_cabin = {"reservation_id": "NO6JO3", "cabin": "first", "flights": [], "payment_id": "x"}
    refused(air, "update_reservation_flights", bad_cabin, "must be one of", INVALID_PARAMETERS)
    assert air.errors == 7


def test_results_are_copies_not_the_live_database(air: Tau2Environment) -> None:
    user = ok(air, "get_user_details", user_id="mia_li_3668")
    user["membership"] = "platinum"
    assert air.db["users"]["mia_li_3668"]["membership"] == "gold"


# -- generic tools -------------------------------------------------------------------------------


def test_calculate(air: Tau2Environment) -> None:
    assert ok(air, "calculate", expression="(2 + 3) * 325.6") == "1628.0"
    assert ok(air, "calculate", expression="10 / 4") == "2.5"
    assert ok(air, "calculate", expression="-3 + 1") == "-2.0"
    refused(air, "calculate", {"expression": "2 + x"}, "Invalid characters")
    refused(air, "calculate", {"expression": "__import__('os')"}, "Invalid characters")
    refused(air, "calculate", {"expression": "1 / 0"}, "Division by zero")
    refused(air, "calculate", {"expression": "2 +"}, "Invalid expression")
    refused(air, "calculate", {"expression": "()"}, "Invalid expression")
    refused(air, "calculate", {"expression": "9 ** 9 ** 9"}, "Invalid expression")


def test_transfer_to_human_agents_changes_nothing(shop: Tau2Environment) -> None:
    before = shop.state_hash()
    assert ok(shop, "transfer_to_human_agents", summary="wants a refund") == "Transfer successful"
    assert shop.state_hash() == before


# -- airline reads -------------------------------------------------------------------------------


def test_airline_reads(air: Tau2Environment) -> None:
    assert ok(air, "get_user_details", user_id="mia_li_3668")["membership"] == "gold"
    refused(air, "get_user_details", {"user_id": "nobody"}, "User nobody not found")
    assert ok(air, "get_reservation_details", reservation_id="NO6JO3")["cabin"] == "business"
    refused(air, "get_reservation_details", {"reservation_id": "ZZZZZZ"}, "not found")
    airports = ok(air, "list_all_airports")
    assert len(airports) == 20 and airports[0] == {"iata": "SFO", "city": "San Francisco"}
    assert ok(air, "get_flight_status", flight_number="HAT001", date="2024-05-14") == "cancelled"
    refused(
        air, "get_flight_status", {"flight_number": "HAT999", "date": "2024-05-14"}, "not found"
    )
    refused(air, "get_flight_status", {"flight_number": "HAT001", "date": "2024-06-01"}, "on date")


def test_airline_searches(air: Tau2Environment) -> None:
    direct = ok(air, "search_direct_flight", origin="PHL", destination="LGA", date="2024-05-20")
    assert direct and all(f["status"] == "available" and f["date"] is None for f in direct)
    assert "HAT001" in {f["flight_number"] for f in direct}
    assert ok(air, "search_direct_flight", origin="PHL", destination="PHL", date="2024-05-20") == []
    pairs = ok(air, "search_onestop_flight", origin="JFK", destination="DFW", date="2024-05-16")
    assert pairs and all(len(p) == 2 and p[0]["date"] == "2024-05-16" for p in pairs)
    assert all(
        p[1]["scheduled_departure_time_est"] >= p[0]["scheduled_arrival_time_est"] for p in pairs
    )
    assert (_next_day("2024-05-01"), _next_day("2024-05-19")) == ("2024-05-2", "2024-05-20")


# -- airline writes ------------------------------------------------------------------------------


def _booking(**over: Any) -> dict[str, Any]:
    args = {
        "user_id": "mia_li_3668",
        "origin": "PHL",
        "destination": "LGA",
        "flight_type": "one_way",
        "cabin": "economy",
        "flights": [{"flight_number": "HAT001", "date": "2024-05-20"}],
        "passengers": [{"first_name": "Mia", "last_name": "Li", "dob": "1990-04-05"}],
        "payment_methods": [{"payment_id": "credit_card_4421486", "amount": 137 + 30 + 50}],
        "total_baggages": 1,
        "nonfree_baggages": 1,
        "insurance": "yes",
    }
    return {**args, **over}


def test_book_reservation_refusals(air: Tau2Environment) -> None:
    refused(air, "book_reservation", _booking(user_id="ghost"), "User ghost not found")
    flight = {"flight_number": "HAT999", "date": "2024-05-20"}
    refused(air, "book_reservation", _booking(flights=[flight]), "Flight HAT999 not found")
    flight = {"flight_number": "HAT001", "date": "2024-07-01"}
    refused(air, "book_reservation", _booking(flights=[flight]), "not found on date")
    flight = {"flight_number": "HAT001", "date": "2024-05-14"}  # cancelled that day
    refused(air, "book_reservation", _booking(flights=[flight]), "not available on date")
    air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] = 0
    refused(air, "book_reservation", _booking(), "Not enough seats on flight HAT001")
    air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] = 17
    pay = [{"payment_id": "gift_card_1", "amount": 217}]
    refused(air, "book_reservation", _booking(payment_methods=pay), "gift_card_1 not found")
    pay = [{"payment_id": "certificate_4856383", "amount": 217}]  # holds 100
    refused(air, "book_reservation", _booking(payment_methods=pay), "Not enough balance")
    pay = [{"payment_id": "credit_card_4421486", "amount": 200}]
    refused(
        air,
        "book_reservation",
        _booking(payment_methods=pay),
        "total price is 217, but paid 200",
    )
    refused(air, "book_reservation", _booking(insurance="maybe"), "one of", INVALID_PARAMETERS)
    for rid in ("HATHAT", "HATHAU", "HATHAV"):
        air.db["reservations"][rid] = {}
    refused(air, "book_reservation", _booking(), "No reservation id is free")


def test_book_reservation_charges_and_saves(air: Tau2Environment) -> None:
    pay = [
        {"payment_id": "certificate_4856383", "amount": 100},
        {"payment_id": "credit_card_4421486", "amount": 117},
    ]
    booked = ok(air, "book_reservation", **_booking(payment_methods=pay))
    assert booked["reservation_id"] == "HATHAT" and booked["created_at"] == "2024-05-15T15:00:00"
    assert booked["flights"][0]["price"] == 137 and "status" not in booked
    user = air.db["users"]["mia_li_3668"]
    assert "certificate_4856383" not in user["payment_methods"]  # a used certificate is gone
    assert user["reservations"][-1] == "HATHAT"
    assert air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["economy"] == 16
    again = ok(air, "book_reservation", **_booking())
    assert again["reservation_id"] == "HATHAU"


def test_cancel_reservation_refunds_every_time_and_releases_nothing(air: Tau2Environment) -> None:
    refused(air, "cancel_reservation", {"reservation_id": "ZZZZZZ"}, "not found")
    once = ok(air, "cancel_reservation", reservation_id="NO6JO3")
    assert once["status"] == "cancelled"
    assert once["payment_history"][-1] == {"payment_id": "credit_card_1955700", "amount": -2504}
    twice = ok(air, "cancel_reservation", reservation_id="NO6JO3")
    assert len(twice["payment_history"]) == 4  # upstream quirk: refunds the refund history again


def _gift_user(env: Tau2Environment, amount: float) -> None:
    """Give mia_li_3668 a gift card holding ``amount``."""
    methods = env.db["users"]["mia_li_3668"]["payment_methods"]
    methods["gift_card_1"] = {"source": "gift_card", "id": "gift_card_1", "amount": amount}


def test_update_reservation_baggages(air: Tau2Environment) -> None:
    args = {"reservation_id": "NO6JO3", "total_baggages": 4, "nonfree_baggages": 2}
    refused(
        air,
        "update_reservation_baggages",
        {**args, "reservation_id": "Z", "payment_id": "credit_card_4421486"},
        "Reservation Z not found",
    )
    refused(air, "update_reservation_baggages", {**args, "payment_id": "nope"}, "not found")
    refused(
        air,
        "update_reservation_baggages",
        {**args, "payment_id": "certificate_4856383"},
        "Certificate cannot be used",
    )
    _gift_user(air, 99.0)
    refused(air, "update_reservation_baggages", {**args, "payment_id": "gift_card_1"}, "not enough")
    _gift_user(air, 150.0)
    res = ok(air, "update_reservation_baggages", **args, payment_id="gift_card_1")
    assert (res["total_baggages"], res["nonfree_baggages"]) == (4, 2)
    assert res["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": 100}
    assert air.db["users"]["mia_li_3668"]["payment_methods"]["gift_card_1"]["amount"] == 50.0
    fewer = ok(
        air,
        "update_reservation_baggages",
        **{**args, "nonfree_baggages": 0},
        payment_id="gift_card_1",
    )
    assert len(fewer["payment_history"]) == 2  # removing bags is free: no entry


def test_update_reservation_flights(air: Tau2Environment) -> None:
    same = [
        {"flight_number": "HAT083", "date": "2024-05-16"},
        {"flight_number": "HAT221", "date": "2024-05-16"},
    ]
    base = {"reservation_id": "NO6JO3", "cabin": "business", "payment_id": "credit_card_4421486"}
    refused(
        air,
        "update_reservation_flights",
        {**base, "reservation_id": "Z", "flights": same},
        "not found",
    )
    kept = ok(air, "update_reservation_flights", **base, flights=same)
    assert [s["price"] for s in kept["flights"]] == [483, 1991]  # unchanged: old prices
    assert len(kept["payment_history"]) == 1  # no difference, no entry
    other = [{"flight_number": "HAT999", "date": "2024-05-16"}]
    refused(air, "update_reservation_flights", {**base, "flights": other}, "HAT999 not found")
    other = [{"flight_number": "HAT001", "date": "2024-05-14"}]
    refused(air, "update_reservation_flights", {**base, "flights": other}, "not available")
    air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["business"] = 0
    other = [{"flight_number": "HAT001", "date": "2024-05-20"}]
    refused(air, "update_reservation_flights", {**base, "flights": other}, "Not enough seats")
    air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["business"] = 13
    refused(
        air,
        "update_reservation_flights",
        {**base, "flights": other, "payment_id": "certificate_4856383"},
        "Certificate cannot be used",
    )
    _gift_user(air, 0.0)
    cheaper = ok(
        air, "update_reservation_flights", **{**base, "payment_id": "gift_card_1"}, flights=other
    )
    # 411 - (483 + 1991) = -2063: refunded to the gift card; seats are not touched.
    assert cheaper["payment_history"][-1] == {"payment_id": "gift_card_1", "amount": -2063}
    assert air.db["users"]["mia_li_3668"]["payment_methods"]["gift_card_1"]["amount"] == 2063.0
    assert air.db["flights"]["HAT001"]["dates"]["2024-05-20"]["available_seats"]["business"] == 13


def test_update_reservation_passengers(air: Tau2Environment) -> None:
    two = [{"first_name": "A", "last_name": "B", "dob": "2000-01-01"}] * 2
    refused(
        air,
        "update_reservation_passengers",
        {"reservation_id": "Z", "passengers": two},
        "not found",
    )
    refused(
        air,
        "update_reservation_passengers",
        {"reservation_id": "NO6JO3", "passengers": two},
        "Number of passengers does not match",
    )
    refused(
        air,
        "update_reservation_passengers",
        {"reservation_id": "NO6JO3", "passengers": [{"first_name": "A"}]},
        "missing required",
        INVALID_PARAMETERS,
    )
    res = ok(air, "update_reservation_passengers", reservation_id="NO6JO3", passengers=two[:1])
    assert res["passengers"] == two[:1]


def test_send_certificate(air: Tau2Environment) -> None:
    refused(air, "send_certificate", {"user_id": "ghost", "amount": 50}, "not found")
    text = ok(air, "send_certificate", user_id="mia_li_3668", amount=50)
    assert text == "Certificate certificate_3221322 added to user mia_li_3668 with amount 50."
    methods = air.db["users"]["mia_li_3668"]["payment_methods"]
    assert methods["certificate_3221322"] == {
        "source": "certificate",
        "id": "certificate_3221322",
        "amount": 50.0,
    }
    ok(air, "send_certificate", user_id="mia_li_3668", amount=1)
    ok(air, "send_certificate", user_id="mia_li_3668", amount=1)
    refused(air, "send_certificate", {"user_id": "mia_li_3668", "amount": 1}, "Too many")


# -- retail --------------------------------------------------------------------------------------


def _order(env: Tau2Environment, status: str, **need: Any) -> dict[str, Any]:
    """The first order with ``status`` whose payment history has one entry (a gift card if
    ``gift``), and at least ``items`` items."""
    for order in env.db["orders"].values():
        history = order["payment_history"]
        if order["status"] != status or len(history) != 1:
            continue
        if (
            need.get("gift") is not None
            and history[0]["payment_method_id"].startswith("gift") != need["gift"]
        ):
            continue
        if len(order["items"]) >= need.get("items", 1):
            return order
    raise AssertionError(f"no {status} order with {need}")


def _variant(env: Tau2Environment, item: dict[str, Any], available: bool = True) -> str:
    variants = env.db["products"][item["product_id"]]["variants"]
    return next(
        v for v, r in variants.items() if v != item["item_id"] and r["available"] == available
    )


def test_retail_reads(shop: Tau2Environment) -> None:
    user = next(iter(shop.db["users"].values()))
    assert ok(shop, "find_user_id_by_email", email=user["email"].upper()) == user["user_id"]
    refused(shop, "find_user_id_by_email", {"email": "no@one.com"}, "User not found")
    name = user["name"]
    found = ok(
        shop,
        "find_user_id_by_name_zip",
        first_name=name["first_name"].lower(),
        last_name=name["last_name"].upper(),
        zip=user["address"]["zip"],
    )
    assert found == user["user_id"]
    args = {"first_name": name["first_name"], "last_name": name["last_name"], "zip": "00000"}
    refused(shop, "find_user_id_by_name_zip", args, "User not found")
    refused(shop, "get_user_details", {"user_id": "ghost"}, "User ghost not found")
    refused(shop, "get_order_details", {"order_id": "#W0"}, "Order #W0 not found")
    refused(shop, "get_product_details", {"product_id": "1"}, "Product 1 not found")
    refused(shop, "get_item_details", {"item_id": "1"}, "Item 1 not found")
    product = next(iter(shop.db["products"].values()))
    item_id = next(iter(product["variants"]))
    assert ok(shop, "get_item_details", item_id=item_id)["item_id"] == item_id
    listing = ok(shop, "list_all_product_types")
    assert isinstance(listing, str) and len(json.loads(listing)) == 50
    assert list(json.loads(listing)) == sorted(json.loads(listing))


def test_cancel_pending_order(shop: Tau2Environment) -> None:
    delivered = _order(shop, "delivered")
    args = {"order_id": delivered["order_id"], "reason": "no longer needed"}
    refused(shop, "cancel_pending_order", args, "Non-pending order cannot be cancelled")
    refused(shop, "cancel_pending_order", {**args, "order_id": "#W0"}, "not found")
    pending = _order(shop, "pending", gift=True)
    refused(
        shop,
        "cancel_pending_order",
        {"order_id": pending["order_id"], "reason": "too expensive"},
        "one of",
        INVALID_PARAMETERS,
    )
    payment = pending["payment_history"][0]
    user = shop.db["users"][pending["user_id"]]
    before = user["payment_methods"][payment["payment_method_id"]]["balance"]
    order = ok(
        shop, "cancel_pending_order", order_id=pending["order_id"], reason="ordered by mistake"
    )
    assert (order["status"], order["cancel_reason"]) == ("cancelled", "ordered by mistake")
    assert order["payment_history"][-1]["transaction_type"] == "refund"
    after = user["payment_methods"][payment["payment_method_id"]]["balance"]
    assert after == round(before + payment["amount"], 2)


def test_modify_pending_order_address_allows_modified_orders(shop: Tau2Environment) -> None:
    address = {
        "address1": "1 A St",
        "address2": "",
        "city": "X",
        "state": "CA",
        "country": "USA",
        "zip": "1",
    }
    delivered = _order(shop, "delivered")
    refused(
        shop,
        "modify_pending_order_address",
        {"order_id": delivered["order_id"], **address},
        "Non-pending",
    )
    pending = _order(shop, "pending")
    pending["status"] = "pending (item modified)"
    order = ok(shop, "modify_pending_order_address", order_id=pending["order_id"], **address)
    assert order["address"]["address1"] == "1 A St"
    refused(shop, "modify_user_address", {"user_id": "ghost", **address}, "User ghost not found")
    user = ok(shop, "modify_user_address", user_id=pending["user_id"], **address)
    assert user["address"]["zip"] == "1"


def test_modify_pending_order_payment(shop: Tau2Environment) -> None:
    order = _order(shop, "pending", gift=False)
    oid, uid = order["order_id"], order["user_id"]
    current = order["payment_history"][0]["payment_method_id"]
    methods = shop.db["users"][uid]["payment_methods"]
    methods["gift_card_9"] = {"source": "gift_card", "id": "gift_card_9", "balance": 0.5}
    delivered = _order(shop, "delivered")
    refused(
        shop,
        "modify_pending_order_payment",
        {"order_id": delivered["order_id"], "payment_method_id": current},
        "Non-pending",
    )
    refused(
        shop,
        "modify_pending_order_payment",
        {"order_id": oid, "payment_method_id": "x"},
        "Payment method not found",
    )
    refused(
        shop,
        "modify_pending_order_payment",
        {"order_id": oid, "payment_method_id": current},
        "should be different",
    )
    refused(
        shop,
        "modify_pending_order_payment",
        {"order_id": oid, "payment_method_id": "gift_card_9"},
        "Insufficient gift card balance",
    )
    methods["gift_card_9"]["balance"] = 100000.0
    amount = order["payment_history"][0]["amount"]
    paid = ok(shop, "modify_pending_order_payment", order_id=oid, payment_method_id="gift_card_9")
    assert [e["transaction_type"] for e in paid["payment_history"]] == [
        "payment",
        "payment",
        "refund",
    ]
    assert methods["gift_card_9"]["balance"] == round(100000.0 - amount, 2)
    refused(
        shop,
        "modify_pending_order_payment",
        {"order_id": oid, "payment_method_id": current},
        "exactly one payment",
    )


def test_modify_pending_order_items(shop: Tau2Environment) -> None:
    order = _order(shop, "pending", items=2)
    oid, uid = order["order_id"], order["user_id"]
    first, second = order["items"][0], order["items"][1]
    pay = order["payment_history"][0]["payment_method_id"]
    new = _variant(shop, first)
    base = {"order_id": oid, "payment_method_id": pay}
    delivered = _order(shop, "delivered")
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "order_id": delivered["order_id"], "item_ids": [], "new_item_ids": []},
        "Non-pending order cannot be modified",
    )
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": ["0"], "new_item_ids": [new]},
        "0 not found",
    )
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": [first["item_id"]], "new_item_ids": []},
        "should match",
    )
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": [first["item_id"]], "new_item_ids": [first["item_id"]]},
        "should be different",
    )
    foreign = next(
        v
        for p in shop.db["products"].values()
        if p["product_id"] != first["product_id"]
        for v in p["variants"]
    )
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": [first["item_id"]], "new_item_ids": [foreign]},
        "not found or available",
    )
    variant = shop.db["products"][first["product_id"]]["variants"][new]
    variant["available"] = False
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": [first["item_id"]], "new_item_ids": [new]},
        "not found or available",
    )
    variant["available"] = True
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "payment_method_id": "x", "item_ids": [first["item_id"]], "new_item_ids": [new]},
        "Payment method not found",
    )
    methods = shop.db["users"][uid]["payment_methods"]
    methods["gift_card_9"] = {"source": "gift_card", "id": "gift_card_9", "balance": 0.0}
    price, variant["price"] = variant["price"], first["price"] + 10.0
    refused(
        shop,
        "modify_pending_order_items",
        {
            **base,
            "payment_method_id": "gift_card_9",
            "item_ids": [first["item_id"]],
            "new_item_ids": [new],
        },
        "Insufficient gift card balance",
    )
    variant["price"] = price
    new2 = _variant(shop, second)
    done = ok(
        shop,
        "modify_pending_order_items",
        **base,
        item_ids=[first["item_id"], second["item_id"]],
        new_item_ids=[new, new2],
    )
    assert done["status"] == "pending (item modified)"
    last = shop.db["products"][second["product_id"]]["variants"][new2]
    # τ² quirk: every rewritten item gets the last processed variant's price and options.
    assert [i["item_id"] for i in done["items"][:2]] == [new, new2]
    assert all(
        i["price"] == last["price"] and i["options"] == last["options"] for i in done["items"][:2]
    )
    refused(
        shop,
        "modify_pending_order_items",
        {**base, "item_ids": [new], "new_item_ids": [first["item_id"]]},
        "Non-pending",
    )


def test_return_delivered_order_items(shop: Tau2Environment) -> None:
    order = _order(shop, "delivered", gift=False)
    oid, uid = order["order_id"], order["user_id"]
    original = order["payment_history"][0]["payment_method_id"]
    item = order["items"][0]["item_id"]
    pending = _order(shop, "pending")
    refused(
        shop,
        "return_delivered_order_items",
        {"order_id": pending["order_id"], "item_ids": [], "payment_method_id": original},
        "Non-delivered order cannot be returned",
    )
    refused(
        shop,
        "return_delivered_order_items",
        {"order_id": oid, "item_ids": [item], "payment_method_id": "x"},
        "Payment method not found",
    )
    methods = shop.db["users"][uid]["payment_methods"]
    methods["credit_card_9"] = {"source": "credit_card", "id": "credit_card_9"}
    refused(
        shop,
        "return_delivered_order_items",
        {"order_id": oid, "item_ids": [item], "payment_method_id": "credit_card_9"},
        "original payment method or a gift card",
    )
    refused(
        shop,
        "return_delivered_order_items",
        {
            "order_id": oid,
            "item_ids": [item, item, item, item, item],
            "payment_method_id": original,
        },
        "Some item not found",
    )
    done = ok(
        shop,
        "return_delivered_order_items",
        order_id=oid,
        item_ids=[item],
        payment_method_id=original,
    )
    assert (done["status"], done["return_items"], done["return_payment_method_id"]) == (
        "return requested",
        [item],
        original,
    )


def test_exchange_delivered_order_items(shop: Tau2Environment) -> None:
    order = _order(shop, "delivered")
    oid, uid = order["order_id"], order["user_id"]
    first = order["items"][0]
    pay = order["payment_history"][0]["payment_method_id"]
    new = _variant(shop, first)
    base = {
        "order_id": oid,
        "payment_method_id": pay,
        "item_ids": [first["item_id"]],
        "new_item_ids": [new],
    }
    pending = _order(shop, "pending")
    refused(
        shop,
        "exchange_delivered_order_items",
        {**base, "order_id": pending["order_id"]},
        "Non-delivered order cannot be exchanged",
    )
    refused(shop, "exchange_delivered_order_items", {**base, "item_ids": ["0"]}, "0 not found")
    refused(shop, "exchange_delivered_order_items", {**base, "new_item_ids": []}, "should match")
    foreign = next(
        v
        for p in shop.db["products"].values()
        if p["product_id"] != first["product_id"]
        for v in p["variants"]
    )
    refused(
        shop,
        "exchange_delivered_order_items",
        {**base, "new_item_ids": [foreign]},
        "not found or available",
    )
    refused(
        shop,
        "exchange_delivered_order_items",
        {**base, "payment_method_id": "x"},
        "Payment method not found",
    )
    methods = shop.db["users"][uid]["payment_methods"]
    methods["gift_card_9"] = {"source": "gift_card", "id": "gift_card_9", "balance": -1.0}
    refused(
        shop,
        "exchange_delivered_order_items",
        {**base, "payment_method_id": "gift_card_9"},
        "Insufficient gift card balance",
    )
    same = ok(
        shop, "exchange_delivered_order_items", **{**base, "new_item_ids": [first["item_id"]]}
    )
    assert same["exchange_price_difference"] == 0.0  # no "new id differs" check, as upstream
    assert same["status"] == "exchange requested" and same["exchange_items"] == [first["item_id"]]


# -- mock ----------------------------------------------------------------------------------------


def test_mock_tools_and_assertions() -> None:
    env = _env("mock")
    refused(env, "create_task", {"user_id": "ghost", "title": "x"}, "User ghost not found")
    task = ok(env, "create_task", user_id="user_1", title="Plan")
    assert task == {"task_id": "task_2", "title": "Plan", "description": None, "status": "pending"}
    refused(env, "update_task_status", {"task_id": "task_9", "status": "completed"}, "not found")
    refused(
        env,
        "update_task_status",
        {"task_id": "task_2", "status": "done"},
        "one of",
        INVALID_PARAMETERS,
    )
    assert (
        ok(env, "update_task_status", task_id="task_2", status="completed")["status"] == "completed"
    )
    assert env.check("assert_task_status", {"task_id": "task_2", "expected_status": "completed"})
    assert not env.check("assert_task_status", {"task_id": "task_9", "expected_status": "pending"})
    assert not env.check("no_such_assertion", {})
    with pytest.raises(Tau2Error, match="Invalid status"):
        mock.update_task_status(env.db, "task_1", "done")
