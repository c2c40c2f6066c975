"""Collusion instruments on hand-made pairs (fidelity.collusion)."""

from __future__ import annotations

from envace_engine.fidelity.collusion import collusion, collusion_metrics, is_echo, mentions
from envace_engine.types import CallRecord, Episode, Mode, ToolCall, ToolError, ToolResult

STRAY = ToolCall("check_stock", {"item": "pen", "qty": 3})
REFUSED = ToolResult(error=ToolError("INVALID_PARAMETERS", "unknown parameter qty"))


def ok(value: object) -> ToolResult:
    return ToolResult(value=value)


def pair(call: ToolCall, rehearsed: ToolResult | None, real: ToolResult) -> CallRecord:
    return CallRecord(0, 1, call, "rehearsed", rehearsed=rehearsed, real=real)


def episode(calls: list[CallRecord], answer: str = "") -> Episode:
    return Episode(
        "e", "t", "toy", Mode.REHEARSAL, "g", (), calls=tuple(calls), final_answers=(answer,)
    )


def test_echo_is_a_wrong_rehearsal_that_repeats_an_argument_the_real_answer_lacks():
    assert is_echo(pair(STRAY, ok({"item": "pen", "qty": 3}), REFUSED))
    assert not is_echo(pair(STRAY, REFUSED, REFUSED))  # right: an error
    same = ToolCall("check_stock", {"item": "pen"})
    assert not is_echo(pair(same, ok({"item": "pen", "stock": 9}), ok({"item": "pen", "stock": 5})))
    assert not is_echo(pair(same, ok({"item": "pen", "stock": 5}), ok({"item": "pen", "stock": 5})))
    assert not is_echo(pair(same, None, REFUSED))  # unparseable: neither echo nor success


def test_rates_on_hand_made_pairs():
    good = ToolCall("check_stock", {"item": "ink"})
    calls = [
        pair(STRAY, ok({"item": "pen", "qty": 3}), REFUSED),  # echo, error as success
        pair(STRAY, REFUSED, REFUSED),  # error recalled
        pair(STRAY, None, REFUSED),  # unparseable rehearsal of a refused call
        pair(good, ok({"stock": 4}), ok({"stock": 4})),  # right
    ]
    c = collusion([episode(calls)])
    assert (c.pairs, c.echoes, c.real_errors) == (4, 1, 3)
    assert (c.errors_rehearsed_as_error, c.errors_rehearsed_as_success) == (1, 1)
    rates = c.rates()
    assert rates["echo_rate"] == 0.25
    assert rates["error_recall"] == 1 / 3 and rates["errors_as_success"] == 1 / 3


def test_an_answer_taken_from_a_wrong_rehearsal():
    balance = ToolCall("get_balance", {"name": "ann"})
    wrong = pair(balance, ok({"ann": 45}), ok({"ann": 9}))
    believed = episode([wrong], "Ann has 45 dollars.")
    corrected = episode([wrong], "Ann has 9 dollars.")
    unrelated = episode([pair(balance, ok({"ann": 9}), ok({"ann": 9}))], "Ann has 45.")
    c = collusion([believed, corrected, unrelated])
    # 45 is a wrong value in two episodes (unrelated has none); one answer holds it
    assert (c.episodes_with_wrong_value, c.episodes_taking_wrong_value) == (2, 1)
    assert collusion_metrics([believed, corrected])["collusion/wrong_answer_taken"] == 0.5
    # an argument repeated back is not a wrong value: "ann" is the request
    assert collusion(
        [episode([pair(balance, ok({"who": "ann"}), ok({"ann": 9}))], "ann")]
    ).rates() == {"echo_rate": 1.0}


def test_values_are_found_as_whole_words():
    assert mentions("There are 5.", "5") and mentions("5.0 left", "5") is False
    assert not mentions("145 items", "45") and mentions("Work saved", "work")


def test_nothing_to_count_gives_no_rate():
    assert collusion([]).rates() == {}
