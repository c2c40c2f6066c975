"""The 16 in-store tools (spec §4), as plain functions over the episode's ``World``.

Three life cycles:

* **product orders** — created ``unpaid`` (the product must belong to the shop; total =
  quantity × price), paid ``unpaid`` → ``paid``, cancelled from any status but ``cancelled``;
* **table bookings** — only where the shop has ``enable_book``; created ``unpaid`` when the
  booking has a price, else already ``paid``; paid and cancelled like orders;
* **reservations** — created ``unconsumed`` (upstream does not check ``enable_reservation``);
  modified (time and count together: an omitted count becomes 0, as upstream) unless consumed
  or cancelled; cancelled from any status but ``cancelled``.

Upstream's answers are kept, including ``Error: …`` texts for unknown ids, which are ordinary
results there; looking up one booking or reservation by an unknown id raises there, so it is an
error result here (``ToolFailure``). An order holds the shop's own product record and sets its
``quantity`` to the ordered count (an upstream quirk, kept: docs/vitabench.md).
"""

from __future__ import annotations

from typing import Any

from envace_engine.environments.vita import fuzzy, reprs
from envace_engine.environments.vita.world import ToolFailure, World, parses, pay, require

Record = dict[str, Any]


def _check_keywords(keywords: list[str]) -> str:
    require(keywords, "Keywords cannot be empty")
    require(isinstance(keywords, list), "Keywords must be a list")
    require(
        all(isinstance(k, str) and k.strip() for k in keywords),
        "All keywords must be non-empty strings",
    )
    return "".join(keywords)


def _shop(world: World, shop_id: str) -> Record | str:
    shop: Record | None = world.db["shops"].get(shop_id)
    return shop if shop is not None else f"Error: Shop {shop_id} does not exist"


def _order(world: World, order_id: str) -> Record | str:
    order: Record | None = world.db["orders"].get(order_id)
    if order is None:
        return f"Error: Order {order_id} not found"
    if order["order_type"] != "instore":
        return f"Error: Order {order_id} is not an instore order"
    return order


def _entry(world: World, table: str, key: str, what: str) -> Record | str:
    entry: Record | None = world.db[table].get(key)
    return entry if entry is not None else f"Error: {what} {key} not found"


def _mine(world: World, table: str, user_id: str) -> list[Record]:
    return [e for e in world.db[table].values() if e["customer_id"] == user_id]


def instore_shop_search_recommend(world: World, keywords: list[str]) -> str:
    """Shop summaries ranked by ``shop_name + "," + ",".join(tags)``."""
    query = _check_keywords(keywords)
    shops = world.db["shops"]
    if not shops:
        return "No shops available"
    docs = {sid: s["shop_name"] + "," + ",".join(s["tags"]) for sid, s in shops.items()}
    return "\n".join(reprs.shop(shops[sid]) for sid in fuzzy.top(query, docs))


def instore_product_search_recommend(world: World, keywords: list[str]) -> str:
    """Product details ranked by ``name + "," + ",".join(tags)``."""
    query = _check_keywords(keywords)
    products = {pid: p for pid, p in world.products.items() if "shop_id" in p}
    if not products:
        return "No products available"
    docs = {pid: p["name"] + "," + ",".join(p["tags"]) for pid, p in products.items()}
    return "\n".join(reprs.shop_product(products[pid]) for pid in fuzzy.top(query, docs))


def create_instore_product_order(
    world: World, user_id: str, shop_id: str, product_id: str, quantity: int = 1
) -> str:
    """Create an unpaid order of one product of a shop; its detail, or why not."""
    world.check_user(user_id)
    require(shop_id, "Shop ID cannot be empty")
    require(product_id, "Product ID cannot be empty")
    require(isinstance(quantity, int), "Quantity must be an integer")
    require(quantity > 0, "Quantity must be greater than 0")
    shop = _shop(world, shop_id)
    if isinstance(shop, str):
        return shop
    if product_id not in [p["product_id"] for p in shop["products"]]:
        return f"Product {product_id} does not exist in shop {shop_id}"
    product = world.products.get(product_id)
    if product is None or "shop_id" not in product:
        return f"Error: Product {product_id} does not exist"
    product["quantity"] = quantity  # upstream overwrites the shop's record (kept quirk)
    order = {
        "order_id": world.new_id("instore"),
        "order_type": "instore",
        "user_id": user_id,
        "store_id": shop_id,
        "note": "",
        "location": None,
        "dispatch_time": "",
        "shipping_time": 0.0,
        "delivery_time": "",
        "total_price": float(quantity * product["price"]),
        "create_time": world.now,
        "update_time": world.now,
        "status": "unpaid",
        "products": [product],
    }
    world.db["orders"][order["order_id"]] = order
    return reprs.order(order, with_products=True)


def pay_instore_order(world: World, order_id: str) -> str:
    """Pay an unpaid product order."""
    require(order_id, "Order ID cannot be empty")
    return pay(_order(world, order_id), order_id, world.now)


def instore_cancel_order(world: World, order_id: str) -> str:
    """Cancel a product order in any status but ``cancelled``."""
    require(order_id, "Order ID cannot be empty")
    order = _order(world, order_id)
    if isinstance(order, str):
        return order
    if order["status"] == "cancelled":
        return f"Order {order_id} is already cancelled."
    order["status"], order["update_time"] = "cancelled", world.now
    return f"Order {order_id} is cancelled."


def _check_visit(
    world: World, user_id: str, shop_id: str, time: str, count: int, what: str
) -> None:
    world.check_user(user_id)
    require(shop_id, "Shop ID cannot be empty")
    require(time, f"{what} time cannot be empty")
    require(isinstance(count, int), "Customer count must be an integer")
    require(count > 0, f"Number of customers for {what.lower()} must be greater than 0")
    require(
        parses(time),
        f"{what} time format is incorrect, correct format is %Y-%m-%d %H:%M:%S",
    )


def instore_book(
    world: World, user_id: str, shop_id: str, time: str, customer_count: int = 1
) -> str:
    """Book a table (shops with ``enable_book``); unpaid if the booking has a price."""
    _check_visit(world, user_id, shop_id, time, customer_count, "Table booking")
    shop = _shop(world, shop_id)
    if isinstance(shop, str):
        return shop
    if not shop["enable_book"]:
        return f"Shop {shop_id} does not support table booking"
    book = {
        "book_id": world.new_id("instore_book"),
        "shop_id": shop_id,
        "book_time": time,
        "update_time": world.now,
        "customer_id": user_id,
        "customer_count": customer_count,
        "book_price": float(shop["book_price"]),
        "status": "unpaid" if shop["book_price"] > 0 else "paid",
    }
    world.db["books"][book["book_id"]] = book
    return reprs.book(book)


def pay_instore_book(world: World, book_id: str) -> str:
    """Pay an unpaid booking."""
    require(book_id, "Booking ID cannot be empty")
    book = _entry(world, "books", book_id, "BookInfo")
    if isinstance(book, str):
        return book
    if book["status"] != "unpaid":
        return f"BookInfo {book_id} is not in `unpaid` status. Current status: {book['status']}"
    book["status"], book["update_time"] = "paid", world.now
    return "Payment successful"


def instore_cancel_book(world: World, book_id: str) -> str:
    """Cancel a booking in any status but ``cancelled``."""
    require(book_id, "Booking ID cannot be empty")
    book = _entry(world, "books", book_id, "BookInfo")
    if isinstance(book, str):
        return book
    if book["status"] == "cancelled":
        return f"BookInfo {book_id} is already cancelled."
    book["status"], book["update_time"] = "cancelled", world.now
    return f"BookInfo {book_id} is cancelled."


def instore_reservation(
    world: World, user_id: str, shop_id: str, time: str, customer_count: int = 1
) -> str:
    """Reserve at a shop (``enable_reservation`` is not checked, as upstream): unconsumed."""
    _check_visit(world, user_id, shop_id, time, customer_count, "Reservation")
    shop = _shop(world, shop_id)
    if isinstance(shop, str):
        return shop
    reservation = {
        "reservation_id": world.new_id("instore_reservation"),
        "shop_id": shop_id,
        "reservation_time": time,
        "update_time": world.now,
        "customer_id": user_id,
        "customer_count": customer_count,
        "status": "unconsumed",
    }
    world.db["reservations"][reservation["reservation_id"]] = reservation
    return reprs.reservation(reservation)


def instore_modify_reservation(
    world: World, reservation_id: str, time: str, customer_count: int = 0
) -> str:
    """Set a reservation's time and count (both: an omitted count becomes 0, as upstream)."""
    require(reservation_id, "Reservation ID cannot be empty")
    require(time, "Reservation time cannot be empty")
    require(isinstance(customer_count, int), "Customer count must be an integer")
    require(
        customer_count >= 0,
        "Number of customers for reservation must be greater than or equal to 0",
    )
    require(
        parses(time), "Reservation time format is incorrect, correct format is %Y-%m-%d %H:%M:%S"
    )
    reservation = _entry(world, "reservations", reservation_id, "ReservationInfo")
    if isinstance(reservation, str):
        return reservation
    if reservation["status"] in ("consumed", "cancelled"):
        return f"ReservationInfo {reservation_id} is already {reservation['status']}."
    reservation["reservation_time"], reservation["customer_count"] = time, customer_count
    reservation["update_time"] = world.now
    return reprs.reservation(reservation)


def instore_cancel_reservation(world: World, reservation_id: str) -> str:
    """Cancel a reservation in any status but ``cancelled``."""
    require(reservation_id, "Reservation ID cannot be empty")
    reservation = _entry(world, "reservations", reservation_id, "ReservationInfo")
    if isinstance(reservation, str):
        return reservation
    if reservation["status"] == "cancelled":
        return f"ReservationInfo {reservation_id} is already cancelled."
    reservation["status"], reservation["update_time"] = "cancelled", world.now
    return f"ReservationInfo {reservation_id} is cancelled."


def get_instore_orders(world: World, user_id: str) -> str:
    """The detail of each of the user's in-store product orders."""
    world.check_user(user_id)
    found = [
        o
        for o in world.db["orders"].values()
        if o["order_type"] == "instore" and o["user_id"] == user_id
    ]
    if not found:
        return f"User {user_id} has no order information."
    return "\n".join(reprs.order(o, with_products=True) for o in found)


def get_instore_reservations(world: World, user_id: str) -> str:
    """Each of the user's reservations."""
    world.check_user(user_id)
    found = _mine(world, "reservations", user_id)
    if not found:
        return f"User {user_id} has no reservation information."
    return "\n".join(reprs.reservation(r) for r in found)


def get_instore_books(world: World, user_id: str) -> str:
    """Each of the user's table bookings."""
    world.check_user(user_id)
    found = _mine(world, "books", user_id)
    if not found:
        return f"User {user_id} has no book information."
    return "\n".join(reprs.book(b) for b in found)


def search_instore_book(world: World, user_id: str, book_id: str | None = None) -> str:
    """One of the user's bookings by id, or all of them."""
    if book_id is None:
        return get_instore_books(world, user_id)
    world.check_user(user_id)
    book = world.db["books"].get(book_id)
    if book is None:  # upstream raises here (unlike the other tools): an error result
        raise ToolFailure(f"BookInfo {book_id} not found")
    if book["customer_id"] != user_id:
        return f"BookInfo {book_id} is not belong to user {user_id}."
    return reprs.book(book)


def search_instore_reservation(
    world: World, user_id: str, reservation_id: str | None = None
) -> str:
    """One of the user's reservations by id, or all of them."""
    if reservation_id is None:
        return get_instore_reservations(world, user_id)
    world.check_user(user_id)
    reservation = world.db["reservations"].get(reservation_id)
    if reservation is None:  # upstream raises here: an error result
        raise ToolFailure(f"ReservationInfo {reservation_id} not found")
    if reservation["customer_id"] != user_id:
        return f"ReservationInfo {reservation_id} is not belong to user {user_id}."
    return reprs.reservation(reservation)
