"""Collusion instruments: the ways a world role can make the world easier instead of truer, and
an agent that believes it. Pure functions over recorded calls (no model, no environment).

Over the calls with both a rehearsed and a real answer (``pairs``; an unparseable rehearsal is
a pair whose rehearsal is neither a success nor an error):

* ``echo_rate`` — a rehearsal that differs from the real answer and repeats one of the call's
  argument values that the real answer does not hold (``{"qty": 3}`` back for a stray ``qty=3``
  the real tool rejects): the world answering with what the agent said rather than what the
  tool knows;
* ``error_recall`` — of the calls the real tool refused, the share rehearsed as an error;
* ``errors_as_success`` — of the calls the real tool refused, the share rehearsed as a success;
* ``wrong_answer_taken`` — over episodes with a *wrong value* (a value a successful rehearsal
  gave that no real answer of the episode gave, and not one of that call's arguments), the
  share whose final answer holds one: the agent reported the rehearsed world, not the real one.

Values are leaves of the canonical JSON (numbers, and strings of two or more characters);
booleans and nulls are too common to be evidence. A value is in an answer when it appears as
a whole word (a number in its shortest form: a rehearsed ``5.0`` is looked for as ``5``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from envace_engine.types import CallRecord, Episode, ToolResult

COLLUSION_RATES = ("echo_rate", "error_recall", "errors_as_success", "wrong_answer_taken")


@dataclass(frozen=True)
class Collusion:
    """Counts behind the rates (so rates of several sets can be pooled) and the rates."""

    pairs: int
    echoes: int
    real_errors: int
    errors_rehearsed_as_error: int
    errors_rehearsed_as_success: int
    episodes_with_wrong_value: int
    episodes_taking_wrong_value: int

    def rates(self) -> dict[str, float]:
        """The four rates; a rate with nothing to count is left out (not 0)."""
        out = {}
        if self.pairs:
            out["echo_rate"] = self.echoes / self.pairs
        if self.real_errors:
            out["error_recall"] = self.errors_rehearsed_as_error / self.real_errors
            out["errors_as_success"] = self.errors_rehearsed_as_success / self.real_errors
        if self.episodes_with_wrong_value:
            out["wrong_answer_taken"] = (
                self.episodes_taking_wrong_value / self.episodes_with_wrong_value
            )
        return out


def leaves(value: Any) -> Iterator[str]:
    """The evidence-bearing scalar values inside a JSON value, as text."""
    if isinstance(value, dict):
        for item in value.values():
            yield from leaves(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from leaves(item)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        number = float(value)
        yield str(int(number)) if number.is_integer() else repr(number)
    elif isinstance(value, str) and len(value.strip()) >= 2:
        yield value.strip()


def _value_leaves(result: ToolResult | None) -> set[str]:
    return set(leaves(result.value)) if result is not None and result.ok else set()


def is_echo(record: CallRecord) -> bool:
    """The rehearsal succeeded, differs from the real answer, and repeats an argument value the
    real answer does not hold."""
    rehearsed, real = record.rehearsed, record.real
    if rehearsed is None or real is None or not rehearsed.ok:
        return False
    if real.ok and real.value == rehearsed.value:
        return False
    echoed = set(leaves(record.call.arguments)) & _value_leaves(rehearsed)
    return bool(echoed - _value_leaves(real))


def wrong_values(episode: Episode) -> set[str]:
    """Values successful rehearsals of ``episode`` gave that no real answer of it gave, less
    each call's own arguments (repeating the request is not evidence of belief)."""
    real = set().union(*(_value_leaves(c.real) for c in episode.calls))
    wrong: set[str] = set()
    for c in episode.calls:
        if c.real is None:
            continue  # nothing says what the real world held
        wrong |= _value_leaves(c.rehearsed) - real - set(leaves(c.call.arguments))
    return wrong


def mentions(text: str, value: str) -> bool:
    """Whether ``value`` appears in ``text`` as a whole word (case-insensitive)."""
    return re.search(rf"(?<![\w.]){re.escape(value)}(?![\w]|\.\d)", text, re.IGNORECASE) is not None


def _pairs(episodes: Iterable[Episode]) -> Iterator[CallRecord]:
    for episode in episodes:
        for c in episode.calls:
            if c.real is not None and c.shown == "rehearsed":
                yield c


def collusion(episodes: Sequence[Episode]) -> Collusion:
    """Every instrument over ``episodes`` (module docstring)."""
    pairs = list(_pairs(episodes))
    refused = [c for c in pairs if c.real is not None and not c.real.ok]
    with_wrong = [(e, wrong_values(e)) for e in episodes]
    with_wrong = [(e, w) for e, w in with_wrong if w]
    taking = sum(
        any(mentions(answer, v) for answer in e.final_answers for v in w) for e, w in with_wrong
    )
    return Collusion(
        pairs=len(pairs),
        echoes=sum(map(is_echo, pairs)),
        real_errors=len(refused),
        errors_rehearsed_as_error=sum(
            c.rehearsed is not None and not c.rehearsed.ok for c in refused
        ),
        errors_rehearsed_as_success=sum(
            c.rehearsed is not None and c.rehearsed.ok for c in refused
        ),
        episodes_with_wrong_value=len(with_wrong),
        episodes_taking_wrong_value=taking,
    )


def collusion_metrics(episodes: Sequence[Episode], prefix: str = "collusion/") -> dict[str, float]:
    """The rates as step metrics (``collusion/echo_rate``, ...)."""
    return {prefix + name: value for name, value in collusion(episodes).rates().items()}
