"""BFCL's multi-turn success check, run over our own per-episode backends.

BFCL's ``multi_turn_checker`` executes both the model's and the ground-truth calls through
``execute_multi_turn_func_call`` (which ``eval``s call strings and keeps instances in module
globals) and then applies two sub-checks after every turn that has ground truth:
``state_checker`` (public attributes of every instance equal) and ``response_checker`` (every
ground-truth execution result appears among the model's results so far). We replay both call
lists through our whitelisted dispatcher on fresh instances and call BFCL's *own* sub-checkers
on them, formatting results exactly as BFCL does, so the verdict equals BFCL's (tested on every
``multi_turn_base`` entry and on wrong call sequences in tests/test_env_bfcl.py).

One deliberate difference: calls are replayed under the episode's rules, so a tool that was not
offered (an excluded function, or a ``miss_func`` tool before its turn) is an error here, while
BFCL's executor would run any public method of the involved classes.

Ground-truth call strings (``"mv(source='a', destination='b')"``) are fixed benchmark data; they
are parsed with ``ast`` and ``literal_eval``, never executed as code.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.environments.tool_environment import RawOutcome, ToolEnvironment
from envace_engine.types import Task, ToolCall


@dataclass(frozen=True)
class CheckResult:
    """BFCL's verdict: ``valid`` and, when invalid, BFCL's ``error_type`` and message."""

    valid: bool
    error_type: str = ""
    message: str = ""


def _to_json_value(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_to_json_value(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_json_value(v) for k, v in value.items()}
    return value


def parse_call_string(text: str, parameter_order: Callable[[str], Sequence[str]]) -> ToolCall:
    """Parse one BFCL ground-truth call string into a ``ToolCall`` (positional args named).

    ``parameter_order(name)`` gives the tool's parameter names in signature order.
    """
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as err:
        raise ValueError(f"not a call expression: {text!r} ({err.msg})") from err
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
        raise ValueError(f"not a plain function call: {text!r}")
    name = node.func.id
    args: dict[str, Any] = {}
    if node.args:
        order = parameter_order(name)
        if len(node.args) > len(order):
            raise ValueError(f"{text!r}: {len(node.args)} positional args, {name} takes {order}")
        for key, arg in zip(order, node.args, strict=False):
            args[key] = _to_json_value(ast.literal_eval(arg))
    for kw in node.keywords:
        if kw.arg is None:
            raise ValueError(f"{text!r}: **kwargs are not supported")
        args[kw.arg] = _to_json_value(ast.literal_eval(kw.value))
    return ToolCall(name=name, arguments=args, raw=text)


def call_string(call: ToolCall) -> str:
    """A BFCL-style call string for a ``ToolCall`` (for display and for tests against BFCL)."""
    inner = ", ".join(f"{k}={v!r}" for k, v in call.arguments.items())
    return f"{call.name}({inner})"


def bfcl_result_string(outcome: RawOutcome) -> str:
    """Format an outcome exactly as ``execute_multi_turn_func_call`` formats execution results."""
    if outcome.error is not None:
        return f"Error during execution: {outcome.error.message}"
    value = outcome.value
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):  # BFCL falls back to str() for unserialisable values
            return str(value)
    return str(value)


def bfcl_check(
    task: Task,
    calls_per_turn: Sequence[Sequence[ToolCall]],
    make_env: Callable[[Task], ToolEnvironment],
) -> CheckResult:
    """BFCL's multi-turn verdict for the agent's committed calls per user turn."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import (
        response_checker,
        state_checker,
    )

    reference = task.reference_calls
    if len(calls_per_turn) != len(reference):
        return CheckResult(
            False,
            "multi_turn:force_terminated",
            f"{len(calls_per_turn)} turns of calls for {len(reference)} user turns",
        )
    model_env, truth_env = make_env(task), make_env(task)
    model_results: list[str] = []
    for turn, (calls, truth_calls) in enumerate(zip(calls_per_turn, reference, strict=True)):
        model_env.start_turn(turn)
        truth_env.start_turn(turn)
        model_results += [bfcl_result_string(model_env.invoke(c)) for c in calls]
        truth_results = [bfcl_result_string(truth_env.invoke(c)) for c in truth_calls]
        if not truth_calls:
            continue  # a turn the model should not be able to fulfil: BFCL checks nothing here
        if not calls:
            return CheckResult(
                False,
                "multi_turn:empty_turn_model_response",
                f"Model response list is empty for turn {turn}",
            )
        verdict = state_checker(model_env.instances, truth_env.instances)
        if verdict["valid"]:
            verdict = response_checker(model_results, truth_results, turn)
        if not verdict["valid"]:
            return CheckResult(False, verdict["error_type"], verdict["error_message"])
    return CheckResult(True)
