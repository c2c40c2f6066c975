"""What every τ² domain's tools share: the tool record, the refusal error, the generic tools.

A tool is a plain function ``fn(db, **arguments)`` over the episode's own database (a dict of
JSON data), with our own JSON schema and description for the agent. Tools follow
docs/tasks.md ("τ²-bench"), which follows the behavioural spec: they check everything first and
mutate only afterwards, so a refused call leaves the database unchanged; policy rules are *not*
enforced (that is what the benchmark tests the agent on).
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from envace_engine.environments.schema import openai_tool

Db = dict[str, Any]


class Tau2Error(Exception):
    """A tool refused the call; the message is what the agent sees (``Error: <message>``)."""


@dataclass(frozen=True)
class Tool:
    """One tool of a domain: its code, its schema for the agent and whether it writes."""

    name: str
    fn: Callable[..., Any]
    description: str
    parameters: dict[str, Any]
    writes: bool = False

    @property
    def schema(self) -> dict[str, Any]:
        """The OpenAI function schema the agent sees."""
        return openai_tool(self.name, self.description, self.parameters)


def params(
    required: dict[str, Any] | None = None, optional: dict[str, Any] | None = None
) -> dict[str, Any]:
    """An object schema: ``required`` and ``optional`` map names to property schemas."""
    props = {**(required or {}), **(optional or {})}
    return {"type": "object", "properties": props, "required": list(required or {})}


def string(description: str, enum: list[str] | None = None) -> dict[str, Any]:
    """A string property."""
    out: dict[str, Any] = {"type": "string", "description": description}
    if enum is not None:
        out["enum"] = enum
    return out


def integer(description: str) -> dict[str, Any]:
    """A non-negative integer property (counts and whole-dollar amounts)."""
    return {"type": "integer", "description": description, "minimum": 0}


def number(description: str) -> dict[str, Any]:
    """A number property."""
    return {"type": "number", "description": description}


def array(description: str, items: dict[str, Any]) -> dict[str, Any]:
    """An array property."""
    return {"type": "array", "description": description, "items": items}


def record(properties: dict[str, Any]) -> dict[str, Any]:
    """A nested object whose every listed field is required."""
    return {"type": "object", "properties": properties, "required": list(properties)}


_CHARS = frozenset("0123456789+-*/(). ")
_BINARY: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Pow: operator.pow,
}


def _arith(node: ast.AST) -> float:
    # Floats throughout: a float power overflows (an error) instead of building a huge integer.
    if isinstance(node, ast.Expression):
        return _arith(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
        return float(node.value)  # bool is excluded by the allowed characters
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _arith(node.operand)
        return value if isinstance(node.op, ast.UAdd) else -value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_arith(node.left), _arith(node.right))
    raise Tau2Error("Invalid expression")


def calculate(db: Db, expression: str) -> str:
    """Evaluate an arithmetic expression; the result rounded to 2 decimals, as a string.

    Only digits, ``+ - * / ( ) .`` and spaces are allowed. It is parsed with ``ast`` and
    evaluated node by node (never ``eval``).
    """
    if not set(expression) <= _CHARS:
        raise Tau2Error("Invalid characters in expression")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
        value = _arith(tree)
    except ZeroDivisionError:
        raise Tau2Error("Division by zero") from None
    except (SyntaxError, OverflowError, RecursionError, MemoryError, ValueError) as err:
        raise Tau2Error(f"Invalid expression: {type(err).__name__}") from None
    return str(round(value, 2))


def transfer_to_human_agents(db: Db, summary: str) -> str:
    """Hand the user to a human; changes nothing (the user simulator ends the conversation)."""
    return "Transfer successful"


GENERIC: tuple[Tool, ...] = (
    Tool(
        "calculate",
        calculate,
        "Calculate the result of a mathematical expression.",
        params(
            {
                "expression": string(
                    "The expression to calculate, such as '2 + 2'. It may hold only numbers, "
                    "operators (+, -, *, /), parentheses and spaces."
                )
            }
        ),
    ),
    Tool(
        "transfer_to_human_agents",
        transfer_to_human_agents,
        "Transfer the user to a human agent, with a summary of the user's issue. Only transfer "
        "if the user explicitly asks for a human agent, or if the issue cannot be solved with "
        "the policy and the available tools.",
        params({"summary": string("A summary of the user's issue.")}),
    ),
)


def find(db: Db, table: str, key: Any, what: str) -> dict[str, Any]:
    """``db[table][key]``, or the refusal ``"<what> <key> not found"``."""
    rows = db[table]
    if not isinstance(key, str) or key not in rows:
        raise Tau2Error(f"{what} {key} not found")
    row: dict[str, Any] = rows[key]
    return row
