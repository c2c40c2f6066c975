"""One VitaBench episode's live state, and the two ways a tool can turn a call down.

The state is the task's database as plain JSON data (``dataset.agent_db``: hidden fields are
already gone), plus two indexes that upstream keeps in per-thread registries and that its tools
read: the **product registry** (product id → product, what ``get_*_product_info`` and the
product searches read) and the **gazetteer** (address → coordinates, what geocoding matches
against). Upstream fills both while it parses a task and adds to them while the episode runs,
never clearing the gazetteer between tasks; here both belong to the episode, filled in
upstream's order (the gazetteer list, then order places, then store places; products store by
store), so ranking ties break as upstream's do.

Two upstream quirks are kept on purpose (docs/vitabench.md): a delivery order's product copies
replace the registry's entries (a later look-up shows the ordered quantity and attributes), and an
in-store order holds the shop's own product record, whose ``quantity`` it overwrites.

Refusals: upstream's tools ``assert`` their preconditions and return the assertion text as an
ordinary result (``Refusal`` here); anything they raise becomes an error result that counts
towards the 10-error ending (``ToolFailure``).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from envace_engine.environments.vita.dataset import TIME_FORMAT


class Refusal(Exception):
    """A failed precondition (upstream's ``assert``): the message is the ordinary result."""


class ToolFailure(Exception):
    """A failure upstream raises: the call's result is an error (it counts towards 10)."""


def require(condition: object, message: str) -> None:
    """Refuse the call with ``message`` unless ``condition`` holds."""
    if not condition:
        raise Refusal(message)


def parses(text: str, fmt: str = TIME_FORMAT) -> bool:
    """Whether ``text`` is a date or time in ``fmt``."""
    try:
        datetime.strptime(text, fmt)
    except ValueError:
        return False
    return True


# Order ids: upstream hashes a salt with the wall-clock time; ours hash the episode's counter,
# so the same calls give the same ids (a shadow environment then agrees with the real one).
ID_PREFIXES = {"delivery": "OT", "instore": "OI", "instore_book": "OI", "instore_reservation": "OI"}


@dataclass
class World:
    """The database, its two indexes, and the episode's language ("zh" | "en")."""

    db: dict[str, Any]
    language: str
    products: dict[str, dict[str, Any]] = field(default_factory=dict)
    places: dict[str, tuple[float, float]] = field(default_factory=dict)
    created: int = 0

    @classmethod
    def of(cls, db: dict[str, Any], language: str) -> World:
        """The live state of a fresh database (which it takes over: pass a private copy)."""
        world = cls(db, language)
        for place in db.get("location") or []:
            world.add_place(place)
        for order in (db.get("orders") or {}).values():
            if order.get("location"):
                world.add_place(order["location"])
        for provider in providers(db):
            world.add_place(provider["location"])
            for product in provider["products"]:
                world.products[product["product_id"]] = product
        return world

    @property
    def now(self) -> str:
        """The task's frozen "now" ("YYYY-MM-DD HH:MM:SS")."""
        return str(self.db["time"])

    def add_place(self, place: dict[str, Any]) -> None:
        """Register a location by its address (a later one with the same address replaces it)."""
        self.places[place["address"]] = (float(place["longitude"]), float(place["latitude"]))

    def check_user(self, user_id: str) -> None:
        """Refuse unless ``user_id`` is the task's one user (empty first, as upstream)."""
        require(user_id, "User ID cannot be empty")
        require(user_id == self.db["user_id"], "User ID does not match")

    def new_id(self, scenario: str) -> str:
        """A fresh id for a new order, booking or reservation (deterministic per episode)."""
        taken = {*self.db.get("orders", {}), *self.db.get("books", {})}
        taken |= set(self.db.get("reservations", {}))
        while True:
            self.created += 1
            salt = f"{scenario}|{self.db['user_id']}|{self.now}|{self.created}"
            new = ID_PREFIXES[scenario] + hashlib.sha256(salt.encode()).hexdigest()[:10]
            if new not in taken:
                return new


def providers(db: dict[str, Any]) -> list[dict[str, Any]]:
    """Every store (delivery) and shop (in-store) of a database, in file order."""
    return [*(db.get("stores") or {}).values(), *(db.get("shops") or {}).values()]


def pay(order: dict[str, Any] | str, order_id: str, now: str) -> str:
    """Pay an unpaid order, as both domains' pay tools do: ``order`` is what the domain's
    look-up found (its not-found text passes through), ``now`` the task's frozen time."""
    if isinstance(order, str):
        return order
    if order["status"] != "unpaid":
        return f"Order {order_id} is not in `unpaid` status. Current status: {order['status']}"
    order["status"], order["update_time"] = "paid", now
    return "Payment successful"
