"""Retail tools (τ²-bench behaviour, our own code): 7 read, 7 write, plus the 2 generic ones.

Quirks kept on purpose (docs/tasks.md): ``modify_pending_order_items`` gives every rewritten
item the price and options of the *last* new variant processed; cancelling refunds every entry
of the payment history (refund entries too); the exchange tool has no "new id differs" check.
Gift-card balances are rounded to 2 decimals after every change; price differences of a modify
are not rounded, those of an exchange are.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from envace_engine.environments.tau2.tools import Db, Tau2Error, find

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def find_user_id_by_email(db: Db, email: str) -> str:
    """The id of the first user whose email matches (case-insensitive)."""
    for user_id, user in db["users"].items():
        if user["email"].lower() == email.lower():
            return str(user_id)
    raise Tau2Error("User not found")


def find_user_id_by_name_zip(db: Db, first_name: str, last_name: str, zip: str) -> str:
    """The id of the first user with this name (case-insensitive) and zip code (exact)."""
    for user_id, user in db["users"].items():
        name = user["name"]
        if (
            name["first_name"].lower() == first_name.lower()
            and name["last_name"].lower() == last_name.lower()
            and user["address"]["zip"] == zip
        ):
            return str(user_id)
    raise Tau2Error("User not found")


def get_user_details(db: Db, user_id: str) -> dict[str, Any]:
    """The whole user record."""
    return find(db, "users", user_id, "User")


def get_order_details(db: Db, order_id: str) -> dict[str, Any]:
    """The whole order record."""
    return find(db, "orders", order_id, "Order")


def get_product_details(db: Db, product_id: str) -> dict[str, Any]:
    """The product with all its variants."""
    return find(db, "products", product_id, "Product")


def get_item_details(db: Db, item_id: str) -> dict[str, Any]:
    """The variant record of an item id, searched over every product."""
    for product in db["products"].values():
        variant = product["variants"].get(item_id)
        if variant is not None:
            return dict(variant)
    raise Tau2Error(f"Item {item_id} not found")


def list_all_product_types(db: Db) -> str:
    """A JSON string mapping every product name to its id, sorted by name."""
    names = {p["name"]: p["product_id"] for p in db["products"].values()}
    return json.dumps(names, sort_keys=True)


def _order_user(db: Db, order_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
    order = find(db, "orders", order_id, "Order")
    return order, find(db, "users", order["user_id"], "User")


def _method(user: dict[str, Any], payment_method_id: str) -> dict[str, Any]:
    method = user["payment_methods"].get(payment_method_id)
    if method is None:
        raise Tau2Error("Payment method not found")
    result: dict[str, Any] = method
    return result


def _credit(method: dict[str, Any], amount: float) -> None:
    method["balance"] = round(method["balance"] + amount, 2)


def cancel_pending_order(db: Db, order_id: str, reason: str) -> dict[str, Any]:
    """Cancel a pending order: refund every payment-history entry (gift cards at once)."""
    order, user = _order_user(db, order_id)
    if order["status"] != "pending":
        raise Tau2Error("Non-pending order cannot be cancelled")
    if reason not in CANCEL_REASONS:
        raise Tau2Error("Invalid reason")
    methods = [_method(user, p["payment_method_id"]) for p in order["payment_history"]]
    refunds = []
    for payment, method in zip(order["payment_history"], methods, strict=True):
        refunds.append(
            {
                "transaction_type": "refund",
                "amount": payment["amount"],
                "payment_method_id": payment["payment_method_id"],
            }
        )
        if method["source"] == "gift_card":
            _credit(method, payment["amount"])
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return order


def modify_pending_order_address(
    db: Db,
    order_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
) -> dict[str, Any]:
    """Replace a pending order's shipping address ("pending (item modified)" counts)."""
    order = find(db, "orders", order_id, "Order")
    if "pending" not in order["status"]:
        raise Tau2Error("Non-pending order cannot be modified")
    order["address"] = _address(address1, address2, city, state, country, zip)
    return order


def _address(*fields: str) -> dict[str, str]:
    keys = ("address1", "address2", "city", "state", "country", "zip")
    return dict(zip(keys, fields, strict=True))


def modify_pending_order_payment(db: Db, order_id: str, payment_method_id: str) -> dict[str, Any]:
    """Pay a pending order with another method: a new payment and a refund of the old one."""
    order, user = _order_user(db, order_id)
    if "pending" not in order["status"]:
        raise Tau2Error("Non-pending order cannot be modified")
    new = _method(user, payment_method_id)
    history = order["payment_history"]
    if len(history) != 1 or history[0]["transaction_type"] != "payment":
        raise Tau2Error("There should be exactly one payment for a pending order")
    old_id, amount = history[0]["payment_method_id"], history[0]["amount"]
    if old_id == payment_method_id:
        raise Tau2Error("The new payment method should be different from the current one")
    if new["source"] == "gift_card" and new["balance"] < amount:
        raise Tau2Error("Insufficient gift card balance to pay for the order")
    old = user["payment_methods"].get(old_id)
    history.append(
        {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id}
    )
    history.append({"transaction_type": "refund", "amount": amount, "payment_method_id": old_id})
    if new["source"] == "gift_card":
        _credit(new, -amount)
    if old is not None and old["source"] == "gift_card":
        _credit(old, amount)
    return order


def _check_items(order: dict[str, Any], item_ids: list[str], new_item_ids: list[str]) -> None:
    have = Counter(i["item_id"] for i in order["items"])
    for item_id, count in Counter(item_ids).items():
        if count > have.get(item_id, 0):
            raise Tau2Error(f"{item_id} not found")
    if len(item_ids) != len(new_item_ids):
        raise Tau2Error("The number of items to be exchanged should match")


def _new_variant(db: Db, order: dict, item_id: str, new_id: str) -> tuple[dict, dict]:
    """The first order item with ``item_id`` and the variant ``new_id`` of the same product."""
    item = next(i for i in order["items"] if i["item_id"] == item_id)
    variant = db["products"][item["product_id"]]["variants"].get(new_id)
    if variant is None or not variant["available"]:
        raise Tau2Error(f"New item {new_id} not found or available")
    return item, variant


def modify_pending_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    """Swap items of a pending order for other variants of the same products; settle the
    difference with ``payment_method_id``; status becomes "pending (item modified)"."""
    order, user = _order_user(db, order_id)
    if order["status"] != "pending":
        raise Tau2Error("Non-pending order cannot be modified")
    _check_items(order, item_ids, new_item_ids)
    diff, variant = 0.0, None
    for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
        if item_id == new_id:
            raise Tau2Error("The new item id should be different from the old item id")
        item, variant = _new_variant(db, order, item_id, new_id)
        diff += variant["price"] - item["price"]
    method = _method(user, payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise Tau2Error("Insufficient gift card balance to pay for the new item")
    order["payment_history"].append(
        {
            "transaction_type": "payment" if diff > 0 else "refund",
            "amount": abs(diff),
            "payment_method_id": payment_method_id,
        }
    )
    if method["source"] == "gift_card":
        _credit(method, -diff)
    for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
        item = next(i for i in order["items"] if i["item_id"] == item_id)
        # τ² quirk: the price and options of the last variant processed, for every item.
        assert variant is not None
        item.update(item_id=new_id, price=variant["price"], options=dict(variant["options"]))
    order["status"] = "pending (item modified)"
    return order


def modify_user_address(
    db: Db,
    user_id: str,
    address1: str,
    address2: str,
    city: str,
    state: str,
    country: str,
    zip: str,
) -> dict[str, Any]:
    """Replace a user's default address."""
    user = find(db, "users", user_id, "User")
    user["address"] = _address(address1, address2, city, state, country, zip)
    return user


def return_delivered_order_items(
    db: Db, order_id: str, item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    """Request a return: status "return requested"; no money moves yet."""
    order, user = _order_user(db, order_id)
    if order["status"] != "delivered":
        raise Tau2Error("Non-delivered order cannot be returned")
    method = _method(user, payment_method_id)
    original = order["payment_history"][0]["payment_method_id"]
    if method["source"] != "gift_card" and payment_method_id != original:
        raise Tau2Error(
            "Payment method should be either the original payment method or a gift card"
        )
    have = Counter(i["item_id"] for i in order["items"])
    if any(count > have.get(i, 0) for i, count in Counter(item_ids).items()):
        raise Tau2Error("Some item not found")
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return order


def exchange_delivered_order_items(
    db: Db, order_id: str, item_ids: list[str], new_item_ids: list[str], payment_method_id: str
) -> dict[str, Any]:
    """Request an exchange: status "exchange requested" with the price difference recorded."""
    order, user = _order_user(db, order_id)
    if order["status"] != "delivered":
        raise Tau2Error("Non-delivered order cannot be exchanged")
    _check_items(order, item_ids, new_item_ids)
    diff = 0.0
    for item_id, new_id in zip(item_ids, new_item_ids, strict=True):
        item, variant = _new_variant(db, order, item_id, new_id)
        diff += variant["price"] - item["price"]
    diff = round(diff, 2)
    method = _method(user, payment_method_id)
    if method["source"] == "gift_card" and method["balance"] < diff:
        raise Tau2Error("Insufficient gift card balance to pay for the price difference")
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff
    return order
