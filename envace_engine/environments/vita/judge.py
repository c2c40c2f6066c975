"""VitaBench's judge (spec §6, upstream's "trajectory" evaluator): rubric states carried over
sliding windows of the rendered conversation.

* The rubrics (``dataset.rubrics``) start as ``rubric_0 … rubric_{n-1}``, all unmet; no rubric
  at all is a reward of 1 without asking anyone.
* The conversation (``Line``: role, text and the assistant's calls) is rendered as
  ``[i] role: content`` lines, ``i`` counting from 1 over the lines shown; an assistant's calls
  follow its text as ``name(k=repr(v), …)`` joined by ``.``; messages with neither are left out.
* Windows of ``WINDOW`` lines, each starting ``STEP`` after the last (two lines of overlap);
  the last window is the first that reaches the end.
* Per window the judge gets upstream's ``sliding_window_eval_template`` (system time, the task's
  whole instructions, the window's number and count) and the window plus the current states;
  it answers a JSON list of states. Its answer is read leniently (``json_repair``, as upstream)
  and only the rubrics it names change; an answer that cannot be read keeps the states and is
  counted (``Verdict.unread``).
* reward = 1 iff every rubric is met; ``rubric_score`` = the fraction met.

``complete(messages)`` is the judge: an OpenAI-style chat, returning its text or None when the
endpoint failed. A failed call makes the whole verdict unscorable (``None``), never 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import json_repair

from envace_engine.environments.vita.dataset import prompt

WINDOW = 10  # lines a window shows
STEP = 8  # lines between window starts (WINDOW - STEP lines overlap)
UNEVALUATED = "Not evaluated yet"

Complete = Callable[[list[dict[str, str]]], str | None]


@dataclass(frozen=True)
class Line:
    """One message of the conversation as the judge reads it."""

    role: str  # "user" | "assistant" | "tool"
    content: str
    calls: tuple[tuple[str, Any], ...] = ()  # (tool name, arguments) of an assistant message


@dataclass(frozen=True)
class Verdict:
    """The judge's result: ``reward`` None when the judge could not be asked."""

    reward: float | None
    rubric_score: float | None
    states: tuple[dict[str, Any], ...]
    windows: int
    unread: int  # windows whose answer could not be read (their states kept)


def initial_states(rubrics: Sequence[str]) -> list[dict[str, Any]]:
    """Every rubric unmet, named ``rubric_<i>``."""
    return [
        {
            "rubric_idx": f"rubric_{i}",
            "rubric": text,
            "justification": UNEVALUATED,
            "meetExpectation": False,
        }
        for i, text in enumerate(rubrics)
    ]


def call_text(name: str, arguments: Any) -> str:
    """One call as upstream prints it: ``name(k=repr(v), …)``."""
    if not isinstance(arguments, dict):
        return f"{name}({arguments!r})"
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in arguments.items())})"


def render(lines: Sequence[Line]) -> list[str]:
    """The ``[i] role: content`` lines the judge reads (empty messages left out)."""
    shown = []
    for line in lines:
        calls = ".".join(call_text(name, args) for name, args in line.calls)
        text = " ".join(part for part in (line.content.strip(), calls) if part)
        if text:
            shown.append((line.role, text))
    return [f"[{i}] {role}: {text}" for i, (role, text) in enumerate(shown, start=1)]


def windows(n: int, size: int = WINDOW, step: int = STEP) -> list[tuple[int, int]]:
    """``[start, end)`` of each window over ``n`` lines (one window when ``n <= size``)."""
    spans = []
    for start in range(0, max(n, 1), step):
        spans.append((start, min(start + size, n)))
        if start + size >= n:
            break
    return spans


def judge_messages(
    window: Sequence[str],
    states: Sequence[dict[str, Any]],
    where: tuple[int, int],
    task: tuple[str, str, str],
) -> list[dict[str, str]]:
    """The chat for one window; ``where`` = (window number from 1, windows), ``task`` =
    (instructions, system time with weekday, language)."""
    instructions, time, language = task
    env_info = json.dumps({"system_time": time, "database": []}, ensure_ascii=False)
    system = prompt("sliding_window_eval_template", language).format(
        env_info=env_info,
        user_instruction=instructions,
        window_idx=where[0],
        total_windows=where[1],
    )
    user = (
        f"<window_content>{chr(10).join(window)}</window_content>\n"
        f"<current_rubrics>{json.dumps(list(states), ensure_ascii=False)}</current_rubrics>"
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def _met(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    return None


def updated(states: Sequence[dict[str, Any]], answer: str) -> list[dict[str, Any]] | None:
    """The states after the judge's ``answer``: each rubric it names with a readable verdict
    is replaced; None when the answer holds no readable state at all."""
    try:
        parsed = json_repair.loads(answer)
    except Exception:  # json_repair gives up on some inputs: an unreadable answer
        return None
    if isinstance(parsed, dict):  # {"rubrics": [...]} or one bare state
        listed = next((v for v in parsed.values() if isinstance(v, list)), [parsed])
        parsed = listed
    if not isinstance(parsed, list):
        return None
    out = [dict(s) for s in states]
    index = {s["rubric_idx"]: i for i, s in enumerate(out)}
    read = False
    for item in parsed:
        if not isinstance(item, dict) or item.get("rubric_idx") not in index:
            continue
        met = _met(item.get("meetExpectation"))
        if met is None:
            continue
        state = out[index[item["rubric_idx"]]]
        state["meetExpectation"] = met
        state["justification"] = str(item.get("justification") or state["justification"])
        read = True
    return out if read else None


def evaluate(
    lines: Sequence[Line],
    rubrics: Sequence[str],
    task: tuple[str, str, str],
    complete: Complete,
) -> Verdict:
    """Judge one conversation against its rubrics (see the module docstring)."""
    states = initial_states(rubrics)
    if not states:
        return Verdict(1.0, 1.0, (), 0, 0)
    shown = render(lines)
    spans = windows(len(shown))
    unread = 0
    for number, (start, end) in enumerate(spans, start=1):
        messages = judge_messages(shown[start:end], states, (number, len(spans)), task)
        answer = complete(messages)
        if answer is None:
            return Verdict(None, None, tuple(states), len(spans), unread)
        new = updated(states, answer)
        if new is None:
            unread += 1
        else:
            states = new
    met = sum(bool(s["meetExpectation"]) for s in states)
    reward = 1.0 if met == len(states) else 0.0
    return Verdict(reward, met / len(states), tuple(states), len(spans), unread)
