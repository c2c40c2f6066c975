"""The 12 delivery tools (spec §4), as plain functions over the episode's ``World``.

An order is created ``unpaid``: its address is geocoded against the task's places, the distance
to the store gives the shipping time (``25 + int(metres) × 0.00651`` minutes, rounded), the
delivery time is the dispatch time plus that, and the total is Σ price × count. Paying moves
``unpaid`` to ``paid``; cancelling works from any status but ``cancelled``; a modification
changes the note only. Every write checks first and writes last, so a refused call changes
nothing. Upstream's answers are kept, including its ``Error: …`` texts for unknown ids, which
are ordinary results there (only what upstream raises is an error result: ``ToolFailure``).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from envace_engine.environments.vita import fuzzy, reprs
from envace_engine.environments.vita.dataset import TIME_FORMAT
from envace_engine.environments.vita.generic import distance_m, geocode
from envace_engine.environments.vita.world import ToolFailure, World, parses, pay, require

Record = dict[str, Any]


def shipping_minutes(distance: float) -> float:
    """Minutes from store to door for a distance in metres (upstream's linear rule)."""
    return float(round(25.00 + int(distance) * 0.006510, 0))


def _product(world: World, product_id: str) -> Record:
    product = world.products.get(product_id)
    if product is None or "store_name" not in product:
        raise ToolFailure(f"{product_id} not found")
    return product


def _order(world: World, order_id: str) -> Record | str:
    """The delivery order, or upstream's ``Error: …`` answer for an unknown or foreign id."""
    order: Record | None = world.db["orders"].get(order_id)
    if order is None:
        return f"Error: Order {order_id} not found"
    if order["order_type"] != "delivery":
        return f"Error: Order {order_id} is not a delivery order"
    return order


def delivery_distance_to_time(world: World, distance: float) -> float:
    """The shipping time in minutes for a distance in metres."""
    return shipping_minutes(distance)


def get_delivery_store_info(world: World, store_id: str) -> str:
    """A store's detail, with its menu."""
    require(store_id, "Store ID cannot be empty")
    store = world.db["stores"].get(store_id)
    return reprs.store(store, with_products=True) if store else f"Error: Store {store_id} not found"


def get_delivery_product_info(world: World, product_id: str) -> str:
    """A dish's detail (from the product registry: an ordered copy once it was ordered)."""
    require(product_id, "Product ID cannot be empty")
    product = world.products.get(product_id)
    if product is None or "store_name" not in product:
        return f"Error: {product_id} not found"
    return reprs.delivery_product(product)


def _check_keywords(keywords: list[str]) -> str:
    require(keywords, "Keywords cannot be empty")
    require(isinstance(keywords, list), "Keywords must be a list")
    require(
        all(isinstance(k, str) and k.strip() for k in keywords),
        "All keywords must be non-empty strings",
    )
    return "".join(keywords)  # upstream joins the keywords with nothing between them


def delivery_store_search_recommend(world: World, keywords: list[str]) -> str:
    """Store summaries ranked by ``name + ",".join(tags)`` (no comma after the name)."""
    query = _check_keywords(keywords)
    stores = world.db["stores"]
    if not stores:
        return "No stores available"
    docs = {sid: s["name"] + ",".join(s["tags"]) for sid, s in stores.items()}
    return "\n".join(reprs.store(stores[sid]) for sid in fuzzy.top(query, docs))


def delivery_product_search_recommend(world: World, keywords: list[str]) -> str:
    """Dish details ranked by ``f"{store_name} {name} {tags}"`` (tags as a Python list)."""
    query = _check_keywords(keywords)
    products = {pid: p for pid, p in world.products.items() if "store_name" in p}
    if not products:
        return "No products available"
    docs = {pid: f"{p['store_name']} {p['name']} {p['tags']}" for pid, p in products.items()}
    return "\n".join(reprs.delivery_product(products[pid]) for pid in fuzzy.top(query, docs))


def create_delivery_order(
    world: World,
    user_id: str,
    store_id: str,
    product_ids: list[str],
    product_cnts: list[int],
    address: str,
    dispatch_time: str,
    attributes: list[str] | None = None,
    note: str = "",
) -> str:
    """Create an unpaid order; its detail, or why it was refused."""
    world.check_user(user_id)
    require(store_id in world.db["stores"], f"Store {store_id} not found")
    products = [_product(world, pid) for pid in product_ids]  # an unknown id raises, as upstream
    require(address != "", f"Location {address} is empty")
    require(
        len(product_ids) == len(product_cnts) and all(c > 0 for c in product_cnts),
        f"product_cnts {product_cnts} list is invalid",
    )
    require(
        dispatch_time and parses(dispatch_time),
        f"dispatch_time {dispatch_time} time format is invalid, yyyy-mm-dd HH:MM:SS required",
    )
    require(
        datetime.strptime(dispatch_time, TIME_FORMAT) >= datetime.strptime(world.now, TIME_FORMAT),
        f"dispatch_time {dispatch_time} must be in the future",
    )
    longitude, latitude = geocode(world, address)  # the last check: it may fail too
    place = {"address": address, "longitude": longitude, "latitude": latitude}
    order = _new_order(world, user_id, store_id, place, dispatch_time, note)
    chosen = [a or "" for a in (attributes or [])[: len(products)]]
    chosen += [""] * (len(products) - len(chosen))
    order["products"] = [
        {**p, "quantity": n, "attributes": a}
        for p, n, a in zip(products, product_cnts, chosen, strict=True)
    ]
    order["total_price"] = float(sum(p["price"] * p["quantity"] for p in order["products"]))
    world.db["orders"][order["order_id"]] = order
    world.add_place(place)
    for product in order["products"]:  # upstream's copies re-register under the same id (kept)
        world.products[product["product_id"]] = product
    return reprs.order(order, with_products=True)


def _new_order(
    world: World, user_id: str, store_id: str, place: Record, dispatch_time: str, note: str
) -> Record:
    """An unpaid order without products: shipping time from the store's distance to ``place``."""
    store = world.db["stores"][store_id]["location"]
    metres = distance_m(
        place["longitude"], place["latitude"], store["longitude"], store["latitude"]
    )
    shipping = shipping_minutes(metres)
    delivered = datetime.strptime(dispatch_time, TIME_FORMAT) + timedelta(minutes=shipping)
    return {
        "order_id": world.new_id("delivery"),
        "order_type": "delivery",
        "user_id": user_id,
        "store_id": store_id,
        "note": note,
        "location": place,
        "dispatch_time": dispatch_time,
        "shipping_time": shipping,
        "delivery_time": delivered.strftime(TIME_FORMAT),
        "total_price": 0.0,
        "create_time": world.now,
        "update_time": world.now,
        "status": "unpaid",
        "products": [],
    }


def pay_delivery_order(world: World, order_id: str) -> str:
    """Pay an unpaid order."""
    require(order_id, "Order ID cannot be empty")
    return pay(_order(world, order_id), order_id, world.now)


def get_delivery_order_status(world: World, order_id: str) -> str:
    """An order's status."""
    require(order_id, "Order ID cannot be empty")
    order = _order(world, order_id)
    return order if isinstance(order, str) else f"Order {order_id} status: {order['status']}"


def cancel_delivery_order(world: World, order_id: str) -> str:
    """Cancel an order in any status but ``cancelled``."""
    require(order_id, "Order ID cannot be empty")
    order = _order(world, order_id)
    if isinstance(order, str):
        return order
    if order["status"] == "cancelled":
        return f"Order {order_id} is already cancelled"
    order["status"], order["update_time"] = "cancelled", world.now
    return f"Order {order_id} has been cancelled."


def modify_delivery_order(world: World, order_id: str, note: str) -> str:
    """Replace an order's note (nothing else can be modified)."""
    require(order_id, "Order ID cannot be empty")
    order = _order(world, order_id)
    if isinstance(order, str):
        return order
    if order["status"] == "cancelled":
        return f"Cannot modify order {order_id} as it is already cancelled"
    order["note"], order["update_time"] = note, world.now
    return f"Order {order_id} has been modified."


def search_delivery_orders(world: World, user_id: str, status: str = "unpaid") -> str:
    """Summaries of the user's delivery orders in one status."""
    world.check_user(user_id)
    found = [
        o
        for o in world.db["orders"].values()
        if o["order_type"] == "delivery" and o["status"] == status and o["user_id"] == user_id
    ]
    return "\n".join(reprs.order(o) for o in found) if found else "No delivery orders available"


def get_delivery_order_detail(world: World, order_id: str) -> str:
    """An order's detail."""
    require(order_id, "Order ID cannot be empty")
    order = _order(world, order_id)
    return order if isinstance(order, str) else reprs.order(order, with_products=True)
