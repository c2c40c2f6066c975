"""Three tiny worlds for the ``toy`` suite: a warehouse, a bank ledger and a notes store.

Each backend has at most four tools with one-line schemas, small integer quantities and compact
results, so that a whole episode of SmolLM2-135M fits in about 600 tokens. Like BFCL's backends,
a backend returns ``{"error": ...}`` for a request that its rules refuse (a value the agent sees),
and its whole state is a plain dict loaded from the task's ``initial_state``.
"""

from __future__ import annotations

import copy
from typing import Any

from envace_engine.environments.schema import openai_tool

_STR = {"type": "string"}
_INT = {"type": "integer", "minimum": 1}


def _tool(name: str, description: str, **params: dict[str, Any]) -> dict[str, Any]:
    schema = {"type": "object", "properties": params, "required": list(params)}
    return openai_tool(name, description, schema)


class Warehouse:
    """Item -> quantity on hand."""

    TOOLS = (
        _tool("list_items", "List all items and their quantities."),
        _tool("check_stock", "Quantity of one item.", item=_STR),
        _tool("add_stock", "Add units of an item.", item=_STR, qty=_INT),
        _tool("remove_stock", "Remove units of an item.", item=_STR, qty=_INT),
    )

    def __init__(self, state: dict[str, Any]) -> None:
        """Load ``{"stock": {item: qty}}`` (copied: the task's state is never mutated)."""
        self.stock: dict[str, int] = copy.deepcopy(state["stock"])

    def list_items(self) -> dict[str, Any]:
        """All items and quantities."""
        return {"stock": dict(self.stock)}

    def check_stock(self, item: str) -> dict[str, Any]:
        """Quantity of one item."""
        if item not in self.stock:
            return {"error": f"unknown item {item}"}
        return {"item": item, "qty": self.stock[item]}

    def add_stock(self, item: str, qty: int) -> dict[str, Any]:
        """Add ``qty`` units (a new item is created)."""
        if qty < 1:
            return {"error": "qty must be at least 1"}
        self.stock[item] = self.stock.get(item, 0) + qty
        return {"item": item, "qty": self.stock[item]}

    def remove_stock(self, item: str, qty: int) -> dict[str, Any]:
        """Remove ``qty`` units; refused beyond what is in stock."""
        have = self.stock.get(item, 0)
        if qty < 1 or qty > have:
            return {"error": f"cannot remove {qty} {item}: {have} in stock"}
        self.stock[item] = have - qty
        return {"item": item, "qty": self.stock[item]}


class Bank:
    """Account -> balance in whole dollars."""

    TOOLS = (
        _tool("get_balance", "Balance of one account.", account=_STR),
        _tool("deposit", "Add money to an account.", account=_STR, amount=_INT),
        _tool("withdraw", "Take money from an account.", account=_STR, amount=_INT),
        _tool("transfer", "Move money between accounts.", source=_STR, target=_STR, amount=_INT),
    )

    def __init__(self, state: dict[str, Any]) -> None:
        """Load ``{"balances": {account: dollars}}`` (copied)."""
        self.balances: dict[str, int] = copy.deepcopy(state["balances"])

    def _known(self, *accounts: str) -> dict[str, Any] | None:
        for account in accounts:
            if account not in self.balances:
                return {"error": f"unknown account {account}"}
        return None

    def get_balance(self, account: str) -> dict[str, Any]:
        """Balance of one account."""
        return self._known(account) or {"account": account, "balance": self.balances[account]}

    def deposit(self, account: str, amount: int) -> dict[str, Any]:
        """Add ``amount`` to an account."""
        if problem := self._known(account):
            return problem
        if amount < 1:
            return {"error": "amount must be at least 1"}
        self.balances[account] += amount
        return {"account": account, "balance": self.balances[account]}

    def withdraw(self, account: str, amount: int) -> dict[str, Any]:
        """Take ``amount`` from an account; refused beyond its balance."""
        if problem := self._known(account):
            return problem
        if amount < 1 or amount > self.balances[account]:
            return {"error": f"cannot withdraw {amount}: balance {self.balances[account]}"}
        self.balances[account] -= amount
        return {"account": account, "balance": self.balances[account]}

    def transfer(self, source: str, target: str, amount: int) -> dict[str, Any]:
        """Move ``amount`` between two different accounts."""
        if problem := self._known(source, target):
            return problem
        if source == target or amount < 1 or amount > self.balances[source]:
            return {"error": f"cannot move {amount} from {source} to {target}"}
        self.balances[source] -= amount
        self.balances[target] += amount
        return {source: self.balances[source], target: self.balances[target]}


class Notes:
    """Title -> one-line note."""

    TOOLS = (
        _tool("list_notes", "Titles of all notes."),
        _tool("read_note", "Text of one note.", title=_STR),
        _tool("write_note", "Create or replace a note.", title=_STR, text=_STR),
        _tool("delete_note", "Delete a note.", title=_STR),
    )

    def __init__(self, state: dict[str, Any]) -> None:
        """Load ``{"notes": {title: text}}`` (copied)."""
        self.notes: dict[str, str] = copy.deepcopy(state["notes"])

    def list_notes(self) -> dict[str, Any]:
        """Sorted note titles."""
        return {"titles": sorted(self.notes)}

    def read_note(self, title: str) -> dict[str, Any]:
        """Text of one note."""
        if title not in self.notes:
            return {"error": f"no note titled {title}"}
        return {"title": title, "text": self.notes[title]}

    def write_note(self, title: str, text: str) -> dict[str, Any]:
        """Create or replace a note."""
        self.notes[title] = text
        return {"saved": title}

    def delete_note(self, title: str) -> dict[str, Any]:
        """Delete a note."""
        if title not in self.notes:
            return {"error": f"no note titled {title}"}
        del self.notes[title]
        return {"deleted": title}


WORLDS: dict[str, type[Warehouse] | type[Bank] | type[Notes]] = {
    "warehouse": Warehouse,
    "bank": Bank,
    "notes": Notes,
}


def describe_world(world: str, state: dict[str, Any]) -> str:
    """Everything a world's backend holds, in its own words (``TaskKey.WORLD_STATE``): what a
    tool can read, so a world role shown it can answer any call (note texts included)."""
    if world == "warehouse":
        return "Stock (item: units): " + ", ".join(f"{k}: {v}" for k, v in state["stock"].items())
    if world == "bank":
        pairs = ", ".join(f"{k}: {v}" for k, v in state["balances"].items())
        return f"Balances (account: dollars): {pairs}"
    notes = "; ".join(f"{k!r}: {v!r}" for k, v in state["notes"].items())
    return f"Notes (title: text): {notes}"


def describe_state(world: str, state: dict[str, Any]) -> str:
    """The world state in one line, for the system prompt (a small model needs to see it)."""
    if world == "warehouse":
        return (
            "You run a small warehouse. Stock: "
            + ", ".join(f"{k} {v}" for k, v in state["stock"].items())
            + "."
        )
    if world == "bank":
        return (
            "You keep a bank ledger. Balances: "
            + ", ".join(f"{k} ${v}" for k, v in state["balances"].items())
            + "."
        )
    return "You manage a notes store. Notes: " + ", ".join(f"{k!r}" for k in state["notes"]) + "."
