"""The tool tables of the two domains, and each tool's OpenAI schema in a task's language.

A tool is a plain function ``fn(world, **arguments)`` (``generic``, ``delivery``, ``instore``)
with its parameters: the JSON types follow upstream's Python signatures (``float`` → number,
``list[str]`` → array of strings; optional parameters carry their default). The texts come from
upstream's descriptions (``data/tool_descriptions.json``) rendered as upstream's schema shows
them: the description, then ``Preconditions:`` and ``Postconditions:`` lines; each parameter's
description is its ``Args`` entry. Where upstream documents a parameter under another name
(``food_id`` for ``product_id``, ``food_ids``/``food_cnts`` for ``product_ids``/``product_cnts``),
our schema gives the real parameter that description (upstream's shows none there).

A domain offers its own tools, then the 8 generic ones (upstream's order).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace_engine.environments.schema import openai_tool
from envace_engine.environments.vita import delivery as d
from envace_engine.environments.vita import generic as g
from envace_engine.environments.vita import instore as i
from envace_engine.environments.vita.dataset import LANGUAGE_KEYS, tool_descriptions

STRING: dict[str, Any] = {"type": "string"}
NUMBER: dict[str, Any] = {"type": "number"}
INTEGER: dict[str, Any] = {"type": "integer"}
STRINGS: dict[str, Any] = {"type": "array", "items": STRING}
INTEGERS: dict[str, Any] = {"type": "array", "items": INTEGER}
_REQUIRED = object()  # a parameter without a default


@dataclass(frozen=True)
class Param:
    """One parameter: its JSON type, its default (none: required) and the name upstream's
    description documents it under when that differs."""

    name: str
    type: dict[str, Any]
    default: Any = _REQUIRED
    documented_as: str = ""

    @property
    def required(self) -> bool:
        """Whether a call must give it."""
        return self.default is _REQUIRED


@dataclass(frozen=True)
class Tool:
    """One tool: its code, the kit whose descriptions it uses, its parameters, whether it
    writes."""

    name: str
    fn: Callable[..., Any]
    kit: str  # "toolkit" (generic), "delivery" or "instore"
    params: tuple[Param, ...] = ()
    writes: bool = False

    def parameters(self, language: str) -> dict[str, Any]:
        """The JSON schema of the arguments, with upstream's parameter descriptions."""
        args = self.doc(language).get("args") or {}
        props: dict[str, Any] = {}
        for p in self.params:
            prop = dict(p.type)
            text = args.get(p.name) or args.get(p.documented_as)
            if text:
                prop["description"] = text
            if not p.required:
                prop["default"] = p.default
            props[p.name] = prop
        required = [p.name for p in self.params if p.required]
        return {"type": "object", "properties": props, "required": required}

    def doc(self, language: str) -> dict[str, Any]:
        """Upstream's description record of this tool in ``language`` (zh | en)."""
        record: dict[str, Any] = tool_descriptions()[self.kit][LANGUAGE_KEYS[language]][self.name]
        return record

    def description(self, language: str) -> str:
        """The description the agent reads: summary, then pre- and postconditions."""
        doc = self.doc(language)
        return (
            f"{doc['description']}\n\nPreconditions:\n    - {doc['preconditions']}\n"
            f"Postconditions:\n    - {doc['postconditions']}"
        )

    def schema(self, language: str) -> dict[str, Any]:
        """The OpenAI function schema in ``language``."""
        return openai_tool(self.name, self.description(language), self.parameters(language))


def _p(name: str, kind: dict[str, Any], default: Any = _REQUIRED, doc: str = "") -> Param:
    return Param(name, kind, default, doc)


def _tool(fn: Callable[..., Any], kit: str, *params: Param, writes: bool = False) -> Tool:
    # A tool is named after its function: the table, not the model's text, names the code.
    return Tool(fn.__name__, fn, kit, params, writes)


_USER = _p("user_id", STRING)
_ORDER = _p("order_id", STRING)
_KEYWORDS = _p("keywords", STRINGS)
_VISIT = (_USER, _p("shop_id", STRING), _p("time", STRING), _p("customer_count", INTEGER, 1))
_BOOK = _p("book_id", STRING)
_RESERVATION = _p("reservation_id", STRING)
_POINTS = ("longitude1", "latitude1", "longitude2", "latitude2")

GENERIC: tuple[Tool, ...] = (
    _tool(g.longitude_latitude_to_distance, "toolkit", *(_p(n, NUMBER) for n in _POINTS)),
    _tool(g.weather, "toolkit", *(_p(n, STRING) for n in ("address", "date_start", "date_end"))),
    _tool(g.address_to_longitude_latitude, "toolkit", _p("address", STRING)),
    _tool(g.get_date_holiday_info, "toolkit", _p("date", STRING)),
    _tool(g.get_holiday_date, "toolkit", _p("year", STRING), _p("holiday_name", STRING)),
    _tool(g.get_user_historical_behaviors, "toolkit"),
    _tool(g.get_user_all_orders, "toolkit"),
    _tool(g.get_nearby, "toolkit", *(_p(n, NUMBER) for n in ("longitude", "latitude", "range"))),
)

DELIVERY: tuple[Tool, ...] = (
    _tool(d.delivery_distance_to_time, "delivery", _p("distance", NUMBER)),
    _tool(d.get_delivery_store_info, "delivery", _p("store_id", STRING)),
    _tool(d.get_delivery_product_info, "delivery", _p("product_id", STRING, doc="food_id")),
    _tool(d.delivery_store_search_recommend, "delivery", _KEYWORDS),
    _tool(d.delivery_product_search_recommend, "delivery", _KEYWORDS),
    _tool(
        d.create_delivery_order,
        "delivery",
        _USER,
        _p("store_id", STRING),
        _p("product_ids", STRINGS, doc="food_ids"),
        _p("product_cnts", INTEGERS, doc="food_cnts"),
        _p("address", STRING),
        _p("dispatch_time", STRING),
        _p("attributes", STRINGS, None),
        _p("note", STRING, ""),
        writes=True,
    ),
    _tool(d.pay_delivery_order, "delivery", _ORDER, writes=True),
    _tool(d.get_delivery_order_status, "delivery", _ORDER),
    _tool(d.cancel_delivery_order, "delivery", _ORDER, writes=True),
    _tool(d.modify_delivery_order, "delivery", _ORDER, _p("note", STRING), writes=True),
    _tool(d.search_delivery_orders, "delivery", _USER, _p("status", STRING, "unpaid")),
    _tool(d.get_delivery_order_detail, "delivery", _ORDER),
)

INSTORE: tuple[Tool, ...] = (
    _tool(i.instore_shop_search_recommend, "instore", _KEYWORDS),
    _tool(i.instore_product_search_recommend, "instore", _KEYWORDS),
    _tool(
        i.create_instore_product_order,
        "instore",
        _USER,
        _p("shop_id", STRING),
        _p("product_id", STRING),
        _p("quantity", INTEGER, 1),
        writes=True,
    ),
    _tool(i.pay_instore_order, "instore", _ORDER, writes=True),
    _tool(i.instore_cancel_order, "instore", _ORDER, writes=True),
    _tool(i.instore_book, "instore", *_VISIT, writes=True),
    _tool(i.pay_instore_book, "instore", _BOOK, writes=True),
    _tool(i.instore_cancel_book, "instore", _BOOK, writes=True),
    _tool(i.instore_reservation, "instore", *_VISIT, writes=True),
    _tool(
        i.instore_modify_reservation,
        "instore",
        _RESERVATION,
        _p("time", STRING),
        _p("customer_count", INTEGER, 0),
        writes=True,
    ),
    _tool(i.instore_cancel_reservation, "instore", _RESERVATION, writes=True),
    _tool(i.get_instore_orders, "instore", _USER),
    _tool(i.get_instore_reservations, "instore", _USER),
    _tool(i.get_instore_books, "instore", _USER),
    _tool(i.search_instore_book, "instore", _USER, _p("book_id", STRING, None)),
    _tool(i.search_instore_reservation, "instore", _USER, _p("reservation_id", STRING, None)),
)

TABLES: dict[str, tuple[Tool, ...]] = {
    "delivery": (*DELIVERY, *GENERIC),
    "instore": (*INSTORE, *GENERIC),
}
