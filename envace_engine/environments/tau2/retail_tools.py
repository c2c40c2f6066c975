"""The retail domain's tool table: our own descriptions and JSON schemas for the 16 tools."""

from __future__ import annotations

from typing import Any

from envace_engine.environments.tau2 import retail as r
from envace_engine.environments.tau2.tools import GENERIC, Tool, array, params, string

_ORDER = string("The order id, such as '#W0000000'. Be careful: it starts with '#'.")
_USER = string("The user id, such as 'sara_doe_496'.")
_PAYMENT = string(
    "The payment method id, such as 'gift_card_0000000' or 'credit_card_0000000'. Look it "
    "up in the user's details."
)
_ITEMS = array(
    "The item ids, such as ['1008292230']; an item may appear more than once.", {"type": "string"}
)
_NEW_ITEMS = array(
    "The new item ids, one per item id above and in the same order, each of the same product.",
    {"type": "string"},
)


def _address() -> dict[str, Any]:
    return {
        "address1": string("The first line of the address, such as '123 Main St'."),
        "address2": string("The second line of the address, such as 'Apt 1' or ''."),
        "city": string("The city, such as 'San Francisco'."),
        "state": string("The state, such as 'CA'."),
        "country": string("The country, such as 'USA'."),
        "zip": string("The zip code, such as '12345'."),
    }


TOOLS: tuple[Tool, ...] = (
    Tool(
        "find_user_id_by_email",
        r.find_user_id_by_email,
        "Find a user id by email. Use it to authenticate the user.",
        params({"email": string("The email of the user, such as 'something@example.com'.")}),
    ),
    Tool(
        "find_user_id_by_name_zip",
        r.find_user_id_by_name_zip,
        "Find a user id by first name, last name and zip code. Use it to authenticate the user "
        "when the email is not known.",
        params(
            {
                "first_name": string("The first name of the user, such as 'John'."),
                "last_name": string("The last name of the user, such as 'Doe'."),
                "zip": string("The zip code of the user, such as '12345'."),
            }
        ),
    ),
    Tool(
        "get_user_details",
        r.get_user_details,
        "Get the details of a user, including their orders.",
        params({"user_id": _USER}),
    ),
    Tool(
        "get_order_details",
        r.get_order_details,
        "Get the status and details of an order.",
        params({"order_id": _ORDER}),
    ),
    Tool(
        "get_product_details",
        r.get_product_details,
        "Get the inventory details of a product (all its variants).",
        params({"product_id": string("The product id, such as '6086499569'.")}),
    ),
    Tool(
        "get_item_details",
        r.get_item_details,
        "Get the details of one item (variant) by its item id.",
        params({"item_id": string("The item id, such as '1008292230'.")}),
    ),
    Tool(
        "list_all_product_types",
        r.list_all_product_types,
        "List the name and product id of every product type.",
        params({}),
    ),
    Tool(
        "cancel_pending_order",
        r.cancel_pending_order,
        "Cancel a pending order. The refund goes to the original payment methods.",
        params(
            {
                "order_id": _ORDER,
                "reason": string(
                    "The reason for cancellation.", ["no longer needed", "ordered by mistake"]
                ),
            }
        ),
        writes=True,
    ),
    Tool(
        "modify_pending_order_address",
        r.modify_pending_order_address,
        "Modify the shipping address of a pending order.",
        params({"order_id": _ORDER, **_address()}),
        writes=True,
    ),
    Tool(
        "modify_pending_order_payment",
        r.modify_pending_order_payment,
        "Modify the payment method of a pending order.",
        params({"order_id": _ORDER, "payment_method_id": _PAYMENT}),
        writes=True,
    ),
    Tool(
        "modify_pending_order_items",
        r.modify_pending_order_items,
        "Modify items of a pending order to other options of the same products. This can be "
        "done only once per order.",
        params(
            {
                "order_id": _ORDER,
                "item_ids": _ITEMS,
                "new_item_ids": _NEW_ITEMS,
                "payment_method_id": _PAYMENT,
            }
        ),
        writes=True,
    ),
    Tool(
        "modify_user_address",
        r.modify_user_address,
        "Modify the default address of a user.",
        params({"user_id": _USER, **_address()}),
        writes=True,
    ),
    Tool(
        "return_delivered_order_items",
        r.return_delivered_order_items,
        "Return items of a delivered order. The refund goes to the original payment method or "
        "a gift card.",
        params({"order_id": _ORDER, "item_ids": _ITEMS, "payment_method_id": _PAYMENT}),
        writes=True,
    ),
    Tool(
        "exchange_delivered_order_items",
        r.exchange_delivered_order_items,
        "Exchange items of a delivered order for other options of the same products. This can "
        "be done only once per order.",
        params(
            {
                "order_id": _ORDER,
                "item_ids": _ITEMS,
                "new_item_ids": _NEW_ITEMS,
                "payment_method_id": _PAYMENT,
            }
        ),
        writes=True,
    ),
    *GENERIC,
)
