"""The texts VitaBench tools answer with: upstream's Python-repr-like renderings of its records.

The agent, the simulated user's view of the agent and the judge all read these texts, so they
follow upstream's ``__repr__``/``__str__`` field for field: a provider's *summary* has no
products, its *detail* lists them one per line; an order's summary has no products, its detail
does. Values print as Python prints them (``price=25.0``, ``tags=['Mild', 'Quick']``). Two
upstream slips are not copied: an order summary and a booking or reservation close their
parenthesis.
"""

from __future__ import annotations

from typing import Any

_DELIVERY_PRODUCT = ("product_id", "name", "store_id", "store_name", "price", "quantity")
_SHOP_PRODUCT = ("product_id", "name", "shop_id", "price", "quantity", "tags")
_ORDER_PROVIDER = {"delivery": "store_id", "instore": "shop_id"}


def location(place: dict[str, Any]) -> str:
    """``<address> longitude:<lon>,latitude:<lat>``."""
    return f"{place['address']} longitude:{place['longitude']},latitude:{place['latitude']}"


def weather(day: dict[str, Any]) -> str:
    """One day of weather: city, category, date, temperature range, humidity."""
    low, high = day["temperature"]
    return (
        f"city: {day['city']}, weather: {day['category']}, datetime: {day['datetime']}, "
        f"temperature: {low}~{high}, humidity: {day['humidity']}"
    )


def delivery_product(p: dict[str, Any]) -> str:
    """A dish as ``StoreProduct(...)``."""
    return (
        f"StoreProduct(store_name={p['store_name']}, store_id={p['store_id']}, "
        f"product_name={p['name']}, product_id={p['product_id']}, "
        f"attributes={p['attributes']}, quantity={p['quantity']}, price={p['price']}, "
        f"tags={p['tags']})"
    )


def shop_product(p: dict[str, Any]) -> str:
    """An in-store product as ``ShopProduct(...)``."""
    return (
        f"ShopProduct(shop_id={p['shop_id']}, product_id={p['product_id']}, name={p['name']}, "
        f"price={p['price']}, quantity={p['quantity']}, tags={p['tags']})"
    )


def store(s: dict[str, Any], with_products: bool = False) -> str:
    """A delivery store: its summary, or its detail with one product per line."""
    head = (
        f"Store(name={s['name']}, store_id={s['store_id']}, score={s['score']}, "
        f"location={location(s['location'])}, tags={s['tags']})"
    )
    if not with_products:
        return head
    return head + ", products=" + "\n".join(delivery_product(p) for p in s["products"])


def shop(s: dict[str, Any]) -> str:
    """An in-store shop's summary (no tool shows a shop's products list)."""
    return (
        f"Shop(shop_name={s['shop_name']}, shop_id={s['shop_id']}, score={s['score']}, "
        f"location={location(s['location'])}, tags={s['tags']}, "
        f"enable_book={s['enable_book']}, book_price={s['book_price']}, "
        f"enable_reservation={s['enable_reservation']})"
    )


def order_product(p: Any) -> str:
    """A product inside an order: a full product record renders as the product does; the
    free-form products of pre-existing orders render as the dicts they are (as upstream)."""
    if isinstance(p, dict) and "attributes" in p and all(k in p for k in _DELIVERY_PRODUCT):
        return delivery_product(p)
    if isinstance(p, dict) and set(p) == set(_SHOP_PRODUCT):
        return shop_product(p)
    return repr(p)


def order(o: dict[str, Any], with_products: bool = False) -> str:
    """An order: its summary, or its detail with its products (a delivery order's detail
    also has its dispatch, shipping and delivery times and its note)."""
    provider = _ORDER_PROVIDER.get(o["order_type"], "store_id")
    head = (
        f"Order(order_id:{o['order_id']}, order_type:{o['order_type']}, "
        f"user_id:{o['user_id']}, {provider}:{o['store_id']}, "
    )
    money = (
        f"total_price:{o['total_price']}, create_time:{o['create_time']}, "
        f"update_time:{o['update_time']}, "
    )
    if not with_products:
        return f"{head}{money}status:{o['status']})"
    products = "[" + ", ".join(order_product(p) for p in o["products"]) + "]"
    if o["order_type"] != "delivery":
        return f"{head}{money}status:{o['status']}, products:{products})"
    times = (
        f"dispatch_time:{o['dispatch_time']}, shipping_time:{o['shipping_time']}, "
        f"delivery_time:{o['delivery_time']}, "
    )
    return f"{head}{times}{money}note:{o['note']}, status:{o['status']}, products:{products})"


def book(b: dict[str, Any]) -> str:
    """A table booking."""
    return (
        f"BookInfo(book_id={b['book_id']}, shop_id={b['shop_id']}, book_time={b['book_time']}, "
        f"customer_id={b['customer_id']}, customer_count={b['customer_count']}, "
        f"book_price={b['book_price']}, status={b['status']})"
    )


def reservation(r: dict[str, Any]) -> str:
    """A reservation."""
    return (
        f"ReservationInfo(reservation_id={r['reservation_id']}, shop_id={r['shop_id']}, "
        f"reservation_time={r['reservation_time']}, customer_id={r['customer_id']}, "
        f"customer_count={r['customer_count']}, status={r['status']})"
    )
