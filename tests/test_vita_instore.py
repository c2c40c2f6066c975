"""VitaBench in-store tools on the real carried data (docs/vitabench.md, spec §4).

Every expected value was worked out by hand from instore/tasks_en.json and the spec, as each
comment says; fuzzy rankings only where a document contains the processed query verbatim
(score 100, ties in file order: see tests/test_vita_tools.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from envace_engine.environments.vita import dataset as data
from envace_engine.environments.vita.env import VitaEnvironment, make_env
from envace_engine.environments.vita.task import build_task
from envace_engine.types import ToolCall, ToolResult

# Task 10826004: user U623530, "now" 2025-11-06 14:30:00, four sports shops (none takes table
# bookings), no orders, bookings or reservations.
GYM = "S17564420237542211"
QUANLI, POWER, KANGTI, WATER = (f"{GYM}_I0000{n}" for n in (1, 3, 4, 5))
SWIM_VOUCHER = f"{GYM}_P00001"  # Quanli's, price 68
# Task 10826247: user U012408, "now" 2023-07-07 09:15:00; shop _I00001 books at 10.0,
# _I00002 takes no bookings, _I00004 books for free; booking 10826247T002 (paid) exists.
CANTON = "S17567842655251946"
# Task 10826079: user U605626, "now" 2024-10-23 19:30:00; reservation 10826079T003 (status
# "paid") exists; shop S17567836603457926_I00002 has enable_reservation false.


def env_for(task_id: str) -> VitaEnvironment:
    """A fresh environment for an in-store task."""
    spec = data.task_spec("instore", "en", task_id)
    return make_env(build_task("instore", "en", spec, opening="hi"))


def call(env: VitaEnvironment, name: str, **arguments: Any) -> ToolResult:
    """Run one call."""
    return env.execute(ToolCall(name, arguments))


def value(env: VitaEnvironment, name: str, **arguments: Any) -> Any:
    """Run one call that must not be an error result; its value."""
    result = call(env, name, **arguments)
    assert result.ok, result.error
    return result.value


def ids(text: str, key: str) -> list[str]:
    """The ids in a search answer, one per line."""
    return [line.split(f"{key}=")[1].split(",")[0] for line in text.splitlines()]


def test_shop_search_order() -> None:
    env = env_for("10826004")
    # Shop documents are name + "," + tags. "swimming" occurs in the names of Quanli Fitness
    # Swimming Club, Kangti Swimming Fitness Club and Water Cube Swimming Pool (file order);
    # Power Space Fitness Center's document has no "swimming": it comes last.
    found = ids(value(env, "instore_shop_search_recommend", keywords=["Swimming"]), "shop_id")
    assert found == [QUANLI, KANGTI, WATER, POWER]


def test_product_search_order() -> None:
    env = env_for("10826004")
    # "aqua aerobics" occurs in P00018 (Kangti, "Aqua Aerobics Group Class ...") and P00022
    # (Water Cube, "Aqua Aerobics Single Experience"); 4 + 4 + 5 + 4 = 17 products in all.
    found = ids(
        value(env, "instore_product_search_recommend", keywords=["Aqua Aerobics"]), "product_id"
    )
    assert found[:2] == [f"{GYM}_P00018", f"{GYM}_P00022"]
    assert len(found) == 17


def test_product_order_life_cycle() -> None:
    env = env_for("10826004")
    assert value(env, "get_instore_orders", user_id="U623530") == (
        "User U623530 has no order information."
    )
    created = value(
        env,
        "create_instore_product_order",
        user_id="U623530",
        shop_id=QUANLI,
        product_id=SWIM_VOUCHER,
        quantity=2,
    )
    (order_id,) = env.state()["orders"]
    order = env.state()["orders"][order_id]
    # 2 × 68.0 = 136.0, unpaid, created "now".
    assert order_id.startswith("OI")
    assert (order["total_price"], order["status"]) == (136.0, "unpaid")
    assert created.startswith(
        f"Order(order_id:{order_id}, order_type:instore, user_id:U623530, "
        f"shop_id:{QUANLI}, total_price:136.0, "
        "create_time:2025-11-06 14:30:00"
    )
    # Upstream's quirk, kept: the shop's own product record now says quantity 2 (it had 15).
    assert "quantity=2" in value(
        env, "instore_product_search_recommend", keywords=["Swimming Class"]
    )
    assert value(env, "pay_instore_order", order_id=order_id) == "Payment successful"
    assert value(env, "pay_instore_order", order_id=order_id) == (
        f"Order {order_id} is not in `unpaid` status. Current status: paid"
    )
    assert (
        value(env, "instore_cancel_order", order_id=order_id) == f"Order {order_id} is cancelled."
    )
    assert value(env, "instore_cancel_order", order_id=order_id) == (
        f"Order {order_id} is already cancelled."
    )
    assert "status:cancelled" in value(env, "get_instore_orders", user_id="U623530")
    assert env.errors == 0


@pytest.mark.parametrize(
    ("changes", "answer"),
    [
        ({"user_id": "U0"}, "User ID does not match"),
        ({"shop_id": ""}, "Shop ID cannot be empty"),
        ({"product_id": ""}, "Product ID cannot be empty"),
        ({"quantity": 0}, "Quantity must be greater than 0"),
        ({"shop_id": "S0"}, "Error: Shop S0 does not exist"),
        # P00010 belongs to Power Space, not to Quanli.
        ({"product_id": f"{GYM}_P00010"}, f"Product {GYM}_P00010 does not exist in shop {QUANLI}"),
    ],
)
def test_product_order_refusals(changes: dict[str, Any], answer: str) -> None:
    env = env_for("10826004")
    args = {"user_id": "U623530", "shop_id": QUANLI, "product_id": SWIM_VOUCHER, **changes}
    assert value(env, "create_instore_product_order", **args) == answer
    assert env.state()["orders"] == {} and env.errors == 0


def test_order_look_ups_answer_upstreams_error_texts() -> None:
    env = env_for("10826004")
    assert value(env, "pay_instore_order", order_id="OI0") == "Error: Order OI0 not found"
    assert value(env, "instore_cancel_order", order_id="OI0") == "Error: Order OI0 not found"
    env.world.db["orders"]["OT1"] = {"order_id": "OT1", "order_type": "delivery"}
    assert value(env, "pay_instore_order", order_id="OT1") == (
        "Error: Order OT1 is not an instore order"
    )
    assert value(env, "get_instore_books", user_id="U623530") == (
        "User U623530 has no book information."
    )
    assert value(env, "get_instore_reservations", user_id="U623530") == (
        "User U623530 has no reservation information."
    )
    # None of these four shops takes table bookings.
    assert (
        value(env, "instore_book", user_id="U623530", shop_id=QUANLI, time="2025-11-07 18:00:00")
        == f"Shop {QUANLI} does not support table booking"
    )


def test_pre_existing_order_renders_its_raw_products() -> None:
    # Order 10826247T001 in the file: no create_time, one product as a plain dict.
    env = env_for("10826247")
    assert value(env, "get_instore_orders", user_id="U012408") == (
        "Order(order_id:10826247T001, order_type:instore, user_id:U012408, "
        f"shop_id:{CANTON}_I00003, total_price:588.0, create_time:, "
        "update_time:2023-07-06 13:15:00, status:paid, products:[{'product_id': "
        f"'{CANTON}_P00021', 'name': '4-Person Classic Cantonese Cuisine Set', 'price': 588, "
        "'quantity': 1}])"
    )


def test_booking_life_cycle() -> None:
    env = env_for("10826247")
    booked = value(
        env,
        "instore_book",
        user_id="U012408",
        shop_id=f"{CANTON}_I00001",
        time="2023-07-08 18:00:00",
        customer_count=2,
    )
    new = next(b for b in env.state()["books"] if b != "10826247T002")
    # The shop's booking price is 10.0 > 0: the booking waits for payment.
    assert booked == (
        f"BookInfo(book_id={new}, shop_id={CANTON}_I00001, book_time=2023-07-08 18:00:00, "
        "customer_id=U012408, customer_count=2, book_price=10.0, status=unpaid)"
    )
    assert value(env, "pay_instore_book", book_id=new) == "Payment successful"
    assert value(env, "pay_instore_book", book_id=new) == (
        f"BookInfo {new} is not in `unpaid` status. Current status: paid"
    )
    assert value(env, "instore_cancel_book", book_id=new) == f"BookInfo {new} is cancelled."
    assert value(env, "instore_cancel_book", book_id=new) == f"BookInfo {new} is already cancelled."
    # A free booking (_I00004, price 0.0) is paid at once.
    free = value(
        env,
        "instore_book",
        user_id="U012408",
        shop_id=f"{CANTON}_I00004",
        time="2023-07-08 18:00:00",
    )
    assert free.endswith("customer_count=1, book_price=0.0, status=paid)")
    listed = value(env, "get_instore_books", user_id="U012408").splitlines()
    assert len(listed) == 3 and listed[0].startswith("BookInfo(book_id=10826247T002,")
    assert value(env, "search_instore_book", user_id="U012408", book_id="10826247T002") == (
        f"BookInfo(book_id=10826247T002, shop_id={CANTON}_I00003, book_time=2023-07-08 12:00:00, "
        "customer_id=U012408, customer_count=4, book_price=50.0, status=paid)"
    )
    assert value(env, "search_instore_book", user_id="U012408") == "\n".join(listed)
    assert env.errors == 0


@pytest.mark.parametrize(
    ("changes", "answer"),
    [
        ({"user_id": ""}, "User ID cannot be empty"),
        ({"time": ""}, "Table booking time cannot be empty"),
        ({"customer_count": 0}, "Number of customers for table booking must be greater than 0"),
        (
            {"time": "2023-07-08 18:00"},
            "Table booking time format is incorrect, correct format is %Y-%m-%d %H:%M:%S",
        ),
        ({"shop_id": "S0"}, "Error: Shop S0 does not exist"),
        ({"shop_id": f"{CANTON}_I00002"}, f"Shop {CANTON}_I00002 does not support table booking"),
    ],
)
def test_booking_refusals(changes: dict[str, Any], answer: str) -> None:
    env = env_for("10826247")
    args = {"user_id": "U012408", "shop_id": f"{CANTON}_I00001", "time": "2023-07-08 18:00:00"}
    assert value(env, "instore_book", **{**args, **changes}) == answer
    assert list(env.state()["books"]) == ["10826247T002"] and env.errors == 0


def test_booking_look_ups() -> None:
    env = env_for("10826247")
    assert value(env, "pay_instore_book", book_id="B0") == "Error: BookInfo B0 not found"
    assert value(env, "instore_cancel_book", book_id="B0") == "Error: BookInfo B0 not found"
    assert value(env, "pay_instore_book", book_id="") == "Booking ID cannot be empty"
    assert env.errors == 0
    # Searching one booking by an unknown id raises upstream: an error result.
    missed = call(env, "search_instore_book", user_id="U012408", book_id="B0")
    assert missed.error is not None and missed.error.message == "BookInfo B0 not found"
    assert env.errors == 1
    env.world.db["books"]["10826247T002"]["customer_id"] = "U0"
    assert value(env, "search_instore_book", user_id="U012408", book_id="10826247T002") == (
        "BookInfo 10826247T002 is not belong to user U012408."
    )


def test_reservation_life_cycle() -> None:
    env = env_for("10826079")
    # enable_reservation is false at this shop; upstream does not check it.
    shop = "S17567836603457926_I00002"
    made = value(
        env,
        "instore_reservation",
        user_id="U605626",
        shop_id=shop,
        time="2024-10-25 18:00:00",
        customer_count=3,
    )
    new = next(r for r in env.state()["reservations"] if r != "10826079T003")
    assert made == (
        f"ReservationInfo(reservation_id={new}, shop_id={shop}, "
        "reservation_time=2024-10-25 18:00:00, customer_id=U605626, customer_count=3, "
        "status=unconsumed)"
    )
    # A modification writes both fields: leaving the count out sets it to 0 (upstream).
    assert value(
        env, "instore_modify_reservation", reservation_id=new, time="2024-10-25 19:00:00"
    ).endswith(
        "reservation_time=2024-10-25 19:00:00, customer_id=U605626, customer_count=0, "
        "status=unconsumed)"
    )
    assert value(env, "instore_cancel_reservation", reservation_id=new) == (
        f"ReservationInfo {new} is cancelled."
    )
    assert value(env, "instore_cancel_reservation", reservation_id=new) == (
        f"ReservationInfo {new} is already cancelled."
    )
    assert value(
        env,
        "instore_modify_reservation",
        reservation_id=new,
        time="2024-10-25 19:00:00",
        customer_count=2,
    ) == (f"ReservationInfo {new} is already cancelled.")
    env.world.db["reservations"]["10826079T003"]["status"] = "consumed"
    assert (
        value(
            env,
            "instore_modify_reservation",
            reservation_id="10826079T003",
            time="2024-10-25 19:00:00",
        )
        == "ReservationInfo 10826079T003 is already consumed."
    )
    assert len(value(env, "get_instore_reservations", user_id="U605626").splitlines()) == 2
    assert env.errors == 0


def test_reservation_look_ups_and_refusals() -> None:
    env = env_for("10826079")
    assert value(
        env, "search_instore_reservation", user_id="U605626", reservation_id="10826079T003"
    ) == (
        "ReservationInfo(reservation_id=10826079T003, shop_id=S17567836452455124_I00004, "
        "reservation_time=2024-10-24 15:00:00, customer_id=U605626, customer_count=1, "
        "status=paid)"
    )
    assert (
        value(env, "instore_modify_reservation", reservation_id="R0", time="2024-10-25 19:00:00")
        == "Error: ReservationInfo R0 not found"
    )
    assert value(
        env,
        "instore_modify_reservation",
        reservation_id="10826079T003",
        time="2024-10-25 19:00:00",
        customer_count=-1,
    ) == ("Number of customers for reservation must be greater than or equal to 0")
    assert (
        value(
            env, "instore_reservation", user_id="U605626", shop_id="S0", time="2024-10-25 19:00:00"
        )
        == "Error: Shop S0 does not exist"
    )
    assert value(
        env,
        "instore_reservation",
        user_id="U605626",
        shop_id="S0",
        time="2024-10-25 19:00:00",
        customer_count=0,
    ) == ("Number of customers for reservation must be greater than 0")
    assert value(env, "instore_cancel_reservation", reservation_id="R0") == (
        "Error: ReservationInfo R0 not found"
    )
    assert env.errors == 0
    missed = call(env, "search_instore_reservation", user_id="U605626", reservation_id="R0")
    assert missed.error is not None and missed.error.message == "ReservationInfo R0 not found"
    assert env.errors == 1
    env.world.db["reservations"]["10826079T003"]["customer_id"] = "U0"
    assert value(
        env, "search_instore_reservation", user_id="U605626", reservation_id="10826079T003"
    ) == ("ReservationInfo 10826079T003 is not belong to user U605626.")
