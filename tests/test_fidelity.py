"""Fidelity tiers on hand-made (rehearsed, real) pairs, with hand-computed numbers."""

from __future__ import annotations

import datetime
import difflib
import enum
import json
import math
import random
import re
import uuid
from dataclasses import astuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from envace_engine.fidelity.metrics import (
    Fidelity,
    canonical_json,
    compare,
    json_tokens,
    key_jaccard,
    nll_per_token,
    score_pairs,
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


def test_a_real_answer_json_cannot_hold_is_still_compared():
    # The real tool is ground truth even when it returns a set: the pair is scored, not lost.
    f = compare(ok({"ids": [1, 2], "n": 2}), ok({"ids": {1, 2}, "n": 2}))
    assert f.parse_valid and f.status_agree and not f.exact
    assert f.key_jaccard == 1.0 and f.value_match == 0.5  # a list is not a set
    assert 0.0 < f.text_similarity < 1.0
    assert score_pairs([(ok({"n": 2}), ok({"n": {2}}), None)])[0] == astuple(
        compare(ok({"n": 2}), ok({"n": {2}}))
    )


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


# -- the fast paths give the textbook numbers ---------------------------------------------------

# The tokenizer pattern as first written (readable, backtracking): json_tokens must agree.
READABLE_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity|[{}\[\]:,]'
)
# Small alphabets, so that texts share many tokens and difflib's recursion branches a lot.
scalars = st.one_of(
    st.sampled_from([0, 1, 2, -1, 100, 105, 1.5, 1e16, -2.5e-3, True, False, None]),
    st.sampled_from(["a", "b", "", 'q"uote', "back\\slash", "é", "x\ny", "nul\x00"]),
    st.floats(allow_nan=True, allow_infinity=True),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=5)
        | st.dictionaries(st.sampled_from(["a", "b", "c", "error"]), inner, max_size=4)
    ),
    max_leaves=12,
)
results = st.one_of(
    json_values.map(ok),
    st.builds(err, st.sampled_from(["E", "F", "TOOL_NOT_AVAILABLE"]), st.sampled_from(["m", "n"])),
)


def difflib_similarity(a_text: str, b_text: str) -> float:
    tokens = READABLE_TOKEN.findall(a_text), READABLE_TOKEN.findall(b_text)
    return difflib.SequenceMatcher(None, *tokens, autojunk=False).ratio()


@settings(max_examples=400, deadline=None)
@given(json_values, json_values)
def test_text_similarity_is_difflibs_ratio_over_json_tokens(a, b):
    a_text, b_text = canonical_json(a), canonical_json(b)
    expected = 1.0 if a_text == b_text else difflib_similarity(a_text, b_text)
    assert text_similarity(a, b) == expected  # the same float, not an approximation


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from("abcd"), max_size=30), st.lists(st.sampled_from("abc"), max_size=30)
)
def test_token_matching_counts_difflibs_matching_blocks(a, b):
    # Long lists over 3-4 strings repeat every token many times: tied longest runs, deep
    # recursion on both sides, runs of one token — where a faster matcher could go wrong.
    a_text, b_text = canonical_json(a), canonical_json(b)
    expected = 1.0 if a_text == b_text else difflib_similarity(a_text, b_text)
    assert text_similarity(a, b) == expected


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_canonical_json_is_json_dumps_sorted_and_compact(value):
    expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert canonical_json(value) == expected
    assert json_tokens(expected) == READABLE_TOKEN.findall(expected)


# What orjson (canonical_json's fast path) writes unlike json, or refuses: floats of every
# magnitude (below 1e-4 it writes 1e-5 where repr writes 1e-05), NaN and infinities, ints past
# 64 bits, lone surrogates, non-str keys, None.
awkward_scalars = st.one_of(
    st.floats(),
    st.floats(min_value=-1e-3, max_value=1e-3),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.text(st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=4),
    st.text(max_size=6),
    st.none(),
    st.booleans(),
)
awkward_values = st.recursive(
    awkward_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=4)
        | st.dictionaries(st.integers(-5, 5), inner, max_size=3)
    ),
    max_leaves=10,
)


@settings(max_examples=1000, deadline=None)
@given(awkward_values)
def test_canonical_json_fast_path_writes_what_json_writes(value):
    try:
        expected = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as err:
        with pytest.raises(type(err)):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def test_canonical_json_writes_uuids_and_enums_as_their_values():
    class Colour(enum.Enum):
        RED = "red"
        DEEP = (1e-05, None)

    key = uuid.UUID(int=5)
    assert canonical_json({"id": key, "c": Colour.RED}) == (
        '{"c":"red","id":"00000000-0000-0000-0000-000000000005"}'
    )
    # The same text whichever path writes it: NaN sends the whole value through json.
    assert canonical_json([Colour.DEEP, key, math.nan]) == (
        '[[1e-05,null],"00000000-0000-0000-0000-000000000005",NaN]'
    )
    with pytest.raises(TypeError):
        canonical_json({"when": datetime.date(2026, 12, 1)})  # dates stay non-JSON


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='{}[]:,"\\-.0123456789eE+truefalsnNIiy x\n', max_size=40))
def test_json_tokens_match_the_readable_pattern_on_any_text(text):
    assert json_tokens(text) == READABLE_TOKEN.findall(text)


def test_canonical_json_rejects_what_json_rejects():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match="circular"):
        canonical_json(loop)
    with pytest.raises(TypeError):
        canonical_json({"x": {1, 2}})
    assert canonical_json({"x": 1}) == '{"x":1}'  # still usable after a failure


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.none() | results, results), max_size=12))
def test_score_pairs_gives_compares_numbers(pairs):
    triples = [(p, r, None) for p, r in pairs]
    assert [Fidelity(*t) for t in score_pairs(triples)] == [compare(p, r) for p, r in pairs]


def test_score_pairs_with_given_texts_and_shared_pairs():
    a, b = ok({"amount": 100, "ok": True}), ok({"amount": 105, "ok": True})
    texts = (canonical_json(a.value), canonical_json(b.value))
    triples = [(a, b, texts), (a, b, texts), (b, a, None), (a, a, None), (None, a, None)]
    expected = [compare(p, r, t) for p, r, t in triples]
    assert [Fidelity(*t) for t in score_pairs(triples)] == expected
    # texts holding NUL cannot be joined for the batch: each pair is then tokenised alone
    odd = ('["a\x00",1]', '["a\x00",2]')
    assert Fidelity(*score_pairs([(a, b, odd)])[0]) == compare(a, b, odd)
    assert score_pairs([]) == []


def test_long_texts_match_difflib():
    # over 1024 tokens per pair: the general coding path rather than the small-pair one
    rng = random.Random(7)
    a = [rng.randrange(40) for _ in range(400)]
    b = [x if rng.random() < 0.8 else rng.randrange(40) for x in a]
    expected = difflib_similarity(canonical_json(a), canonical_json(b))
    assert len(json_tokens(canonical_json(a))) + len(json_tokens(canonical_json(b))) > 1024
    assert text_similarity(a, b) == expected
    (tiers,) = score_pairs([(ok(a), ok(b), None)])
    assert Fidelity(*tiers).text_similarity == expected


def test_more_distinct_tokens_than_characters_falls_back_to_difflib(monkeypatch):
    import envace_engine.fidelity.metrics as fidelity

    made = []

    class CountingMatcher(difflib.SequenceMatcher):
        def __init__(self, *args, **kwargs):
            made.append(1)
            super().__init__(*args, **kwargs)

    a, b = list(range(300, 900)), list(range(0, 1200, 2))  # > 1024 tokens, many distinct
    expected = difflib_similarity(canonical_json(a), canonical_json(b))
    monkeypatch.setattr(fidelity, "_CODE_SPACE", 5)  # 5 codes: these pairs need more
    monkeypatch.setattr(fidelity.difflib, "SequenceMatcher", CountingMatcher)
    assert text_similarity(a, b) == expected
    (tiers,) = score_pairs([(ok(a), ok(b), None)])
    assert Fidelity(*tiers).text_similarity == expected
    assert len(made) == 2  # both went to difflib itself
