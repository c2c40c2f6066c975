"""Fidelity tiers on hand-made (rehearsed, real) pairs, with hand-computed numbers."""

from __future__ import annotations

import math

import pytest

from envace_engine.fidelity import (
    canonical_json,
    compare,
    json_tokens,
    key_jaccard,
    nll_per_token,
    text_similarity,
    value_match,
    values_equal,
)
from envace_engine.types import ToolError, ToolResult


def ok(value):
    return ToolResult(value=value)


def err(code, message="boom"):
    return ToolResult(error=ToolError(code=code, message=message, text="echo"))


def test_identical_pair_is_exact_and_scores_one():
    f = compare(ok({"files": ["a.txt"], "n": 1}), ok({"files": ["a.txt"], "n": 1}))
    assert f.parse_valid and f.status_agree and f.exact
    assert f.error_code_agree is None  # no error on either side: nothing to agree on
    assert (f.key_jaccard, f.value_match, f.text_similarity, f.score) == (1.0, 1.0, 1.0, 1.0)


def test_reordered_keys_are_exact():
    f = compare(ok({"b": 2, "a": {"y": 1, "x": 0}}), ok({"a": {"x": 0, "y": 1}, "b": 2}))
    assert f.exact
    assert f.score == 1.0
    assert canonical_json({"b": 2, "a": 1}) == '{"a":1,"b":2}'


def test_error_versus_success_scores_zero():
    f = compare(err("TOOL_NOT_AVAILABLE"), ok({"balance": 10}))
    assert f.parse_valid
    assert not f.status_agree
    assert f.error_code_agree is False
    assert not f.exact
    assert f.score == 0.0


def test_number_off_by_five_percent_is_a_mismatch():
    # canonical texts {"a":100,"b":"x"} vs {"a":105,"b":"x"}: 9 JSON tokens each, 8 in common
    f = compare(ok({"b": "x", "a": 100}), ok({"a": 105, "b": "x"}))
    assert not f.exact
    assert f.key_jaccard == 1.0
    assert f.value_match == 0.5  # "b" matches, "a" is 5 % off (tolerance is 1 %)
    assert f.text_similarity == pytest.approx(2 * 8 / 18)
    assert f.score == pytest.approx((1.0 + 0.5 + 16 / 18) / 3)


def test_number_within_tolerance_matches():
    assert values_equal(100, 100.5)
    assert not values_equal(100, 105)
    assert values_equal(0, 0.0)
    assert not values_equal(True, 1)  # bools are not numbers here
    assert values_equal([1, {"x": 2.0}], [1, {"x": 2}])
    assert value_match({"a": 100, "b": "x"}, {"a": 100.5, "b": "x"}) == 1.0


def test_key_jaccard_and_value_match_by_hand():
    p, r = {"a": 1, "b": 2, "c": 3}, {"b": 2, "c": 4, "d": 5}
    assert key_jaccard(p, r) == pytest.approx(2 / 4)  # {b,c} over {a,b,c,d}
    assert value_match(p, r) == pytest.approx(1 / 2)  # b equal, c not
    assert key_jaccard({}, {}) == 1.0
    assert value_match({"a": 1}, {"b": 1}) == 0.0
    # scalars and lists are one unnamed field
    assert key_jaccard([1, 2], "x") == 1.0
    assert value_match([1, 2], [1, 2]) == 1.0
    assert text_similarity("ab", "ab") == 1.0
    assert json_tokens('{"a":[1,-2.5e-3,"x\\"y"],"b":null}') == [
        "{",
        '"a"',
        ":",
        "[",
        "1",
        ",",
        "-2.5e-3",
        ",",
        '"x\\"y"',
        "]",
        ",",
        '"b"',
        ":",
        "null",
        "}",
    ]


def test_ok_value_shaped_like_an_error_is_not_exact():
    shaped = ok({"error": {"code": "E", "message": "m"}})
    f = compare(shaped, err("E", "m"))
    assert not f.status_agree and not f.exact and f.score == 0.0


def test_both_errors_same_code_different_message():
    f = compare(err("INVALID_PARAMETERS", "x missing"), err("INVALID_PARAMETERS", "y missing"))
    assert f.status_agree and f.error_code_agree and not f.exact
    # {"error":{"code":"INVALID_PARAMETERS","message":"x missing"}}: 13 tokens, 12 shared
    assert f.text_similarity == pytest.approx(2 * 12 / 26)
    assert f.score == pytest.approx((1.0 + f.text_similarity) / 2)


def test_both_errors_different_codes():
    f = compare(err("TOOL_NOT_AVAILABLE"), err("INVALID_PARAMETERS"))
    assert f.status_agree and f.error_code_agree is False
    assert f.score == pytest.approx(f.text_similarity / 2)


def test_unparsed_or_unserialisable_prediction_is_not_parse_valid():
    for predicted in (None, ok({"x": object()})):
        f = compare(predicted, ok({"x": 1}))
        assert not f.parse_valid and not f.status_agree
        assert f.score == 0.0


def test_nll_per_token_matches_full_logits(tiny_model):
    import torch

    prompt, target = [1, 17, 230, 5, 9], [44, 3, 2]
    nll = nll_per_token(tiny_model, prompt, target, chunk_size=1000)
    with torch.no_grad():
        logits = tiny_model(torch.tensor([prompt + target])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    expected = -sum(float(logp[len(prompt) - 1 + i, t]) for i, t in enumerate(target)) / 3
    assert nll == pytest.approx(expected, rel=1e-4)
    assert math.isfinite(nll) and nll > 0


def test_nll_per_token_rejects_empty_inputs(tiny_model):
    with pytest.raises(ValueError, match="prompt token"):
        nll_per_token(tiny_model, [], [1])
    with pytest.raises(ValueError, match="target token"):
        nll_per_token(tiny_model, [1], [])
