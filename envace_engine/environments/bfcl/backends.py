"""BFCL v4's executable backend classes: their tool schemas, fresh instances and environments.

The classes and their function docs ship in the ``bfcl-eval`` package. Instances are created
per episode here (never through BFCL's executor, which caches instances in module globals keyed
by model name and entry id, and evals call strings). ``_load_scenario`` is BFCL's own loader and
gets a deep copy of the initial config: several backends adopt the dict and mutate it.
"""

from __future__ import annotations

import copy
import importlib
import inspect
import json
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import resources
from typing import Any

from envace_engine.environments.schema import bfcl_doc_to_tool, tool_name
from envace_engine.environments.tool_environment import ToolEnvironment
from envace_engine.types import Task

_PREFIX = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"

# class name -> (backend module, function-doc file). The multi-turn categories use exactly these.
BACKENDS: dict[str, tuple[str, str]] = {
    "GorillaFileSystem": ("gorilla_file_system", "gorilla_file_system.json"),
    "MathAPI": ("math_api", "math_api.json"),
    "MessageAPI": ("message_api", "message_api.json"),
    "TwitterAPI": ("posting_api", "posting_api.json"),
    "TicketAPI": ("ticket_api", "ticket_api.json"),
    "TradingBot": ("trading_bot", "trading_bot.json"),
    "TravelAPI": ("travel_booking", "travel_booking.json"),
    "VehicleControlAPI": ("vehicle_control", "vehicle_control.json"),
}
STATELESS = frozenset({"MathAPI"})  # BFCL never calls _load_scenario on these
# Bounds added to BFCL's schemas where a model-chosen number sets the cost of the tool code
# (big-int powers, decimal / mpmath precision). Every ground-truth value lies well inside.
LIMITS: dict[str, dict[str, tuple[int, int]]] = {
    "power": {"exponent": (-100, 100)},
    "square_root": {"precision": (1, 100)},
    "logarithm": {"precision": (1, 100)},
}


class BackendError(RuntimeError):
    """bfcl-eval is missing or a class name is not one of the BFCL multi-turn backends."""


def _check_class(name: str) -> None:
    if name not in BACKENDS:
        raise BackendError(f"unknown BFCL backend class {name!r}; known: {', '.join(BACKENDS)}")


@cache
def backend_class(name: str) -> type:
    """The backend class object (imports bfcl-eval's module on first use)."""
    _check_class(name)
    try:
        module = importlib.import_module(f"{_PREFIX}.{BACKENDS[name][0]}")
    except ImportError as err:
        raise BackendError(
            "the bfcl suites need bfcl-eval: run `make setup` "
            "(or `pip install --no-deps bfcl-eval`)"
        ) from err
    return getattr(module, name)


@cache
def class_tools(name: str) -> tuple[dict[str, Any], ...]:
    """A class's tools as OpenAI schemas, converted from BFCL's function docs."""
    _check_class(name)
    doc = resources.files("bfcl_eval") / "data" / "multi_turn_func_doc" / BACKENDS[name][1]
    lines = doc.read_text(encoding="utf-8").splitlines()
    tools = tuple(bfcl_doc_to_tool(json.loads(line)) for line in lines if line.strip())
    for tool in tools:
        props = tool["function"]["parameters"]["properties"]
        for param, (low, high) in LIMITS.get(tool_name(tool), {}).items():
            props[param].update(minimum=low, maximum=high)
    return tools


@cache
def tool_owners() -> dict[str, str]:
    """Tool name -> owning class, over all backends (BFCL's tool names are globally unique)."""
    return {tool_name(t): cls for cls in BACKENDS for t in class_tools(cls)}


@cache
def parameter_order(tool: str) -> tuple[str, ...]:
    """Parameter names of a tool in signature order (to map positional ground-truth args)."""
    method = getattr(backend_class(tool_owners()[tool]), tool)
    return tuple(p for p in inspect.signature(method).parameters if p != "self")


def new_instances(
    initial_config: Mapping[str, Any], classes: Iterable[str], long_context: bool = False
) -> dict[str, Any]:
    """Fresh, loaded instances of ``classes`` at ``initial_config`` (one per class)."""
    instances = {}
    for name in classes:
        instance = backend_class(name)()
        if name not in STATELESS:
            config = copy.deepcopy(initial_config.get(name, {}))
            instance._load_scenario(config, long_context=long_context)
        instances[name] = instance
    return instances


def tools_for(
    classes: Iterable[str], excluded: Iterable[str] = (), held_out: Iterable[str] = ()
) -> list[dict[str, Any]]:
    """Tools of ``classes`` in BFCL's order, minus excluded and held-out function names."""
    drop = set(excluded) | set(held_out)
    return [t for c in classes for t in class_tools(c) if tool_name(t) not in drop]


def make_bfcl_env(
    task: Task, env_class: type[ToolEnvironment] = ToolEnvironment
) -> ToolEnvironment:
    """A fresh environment for a task over BFCL backends (``bfcl`` and ``bfcl-gen`` suites);
    ``env_class`` says how calls dispatch (``official.OfficialEnvironment``: as BFCL does).

    Reads ``meta``: ``involved_classes``, ``excluded_function``, ``missed_function``
    ({turn: [names]}, tools that appear at that turn) and ``long_context``.
    """
    meta = task.meta
    classes = list(meta["involved_classes"])
    missed = {int(t): list(names) for t, names in meta.get("missed_function", {}).items()}
    turn_tools = {
        turn: [t for c in classes for t in class_tools(c) if tool_name(t) in names]
        for turn, names in missed.items()
    }
    instances = new_instances(task.initial_state, classes, bool(meta.get("long_context")))
    # BFCL maps method names class by class, so a later class wins a shared name.
    owners = {tool_name(t): c for c in classes for t in class_tools(c)}
    return env_class(task, instances, list(task.tools), owners, turn_tools)
