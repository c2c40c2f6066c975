"""Fidelity of a rehearsed tool response against the real one, in tiers (no sampling, no judge).

Every tier compares the *canonical form* of a ``ToolResult``: its JSON value when it succeeded, or
``{"error": {"code": ..., "message": ...}}`` when it failed (the offending text is left out: it
echoes the model's output, not the world's answer). Canonical JSON sorts keys and drops
whitespace, so key order never matters.

Tiers, cheapest first:

* ``parse_valid`` — a predicted response exists and is JSON-serialisable. A rehearsal the engine
  could not parse never reaches the pair as a value (the episode stops with
  ``unparseable_rehearsal``), so storage records such a call with ``predicted=None``.
* ``status_agree`` — both succeeded or both failed; ``error_code_agree`` — both failed with the
  same code (None when neither failed: there is nothing to agree on).
* ``exact`` — canonical JSON equality.
* ``key_jaccard`` — |K_p ∩ K_r| / |K_p ∪ K_r| over top-level keys (1.0 when both have no keys);
  a non-object value counts as the single key ``""`` so scalars and lists compare too.
* ``value_match`` — the fraction of shared keys whose values are equal, deeply, with numbers
  equal within a relative tolerance of 1 % (``REL_TOL``): 100 vs 100.5 match, 100 vs 105 do not.
  Booleans are never numbers here (True is not 1). 0.0 when no key is shared.
* ``text_similarity`` — ``difflib.SequenceMatcher(None, a, b, autojunk=False).ratio()`` over
  the two canonical JSON texts, compared as sequences of JSON tokens (strings, numbers,
  literals, punctuation) rather than characters: the same diff a reader sees. That is
  ``2 * M / (len(a) + len(b))`` where ``M`` counts the tokens in difflib's matching blocks
  (Ratcliff/Obershelp: take the longest common run of tokens — leftmost in ``a``, then in
  ``b``, on ties — and recurse on both sides of it). Storage scores every pair at write time,
  so this module computes the same ``M`` without difflib: each token becomes one character and
  the longest-run search is C-level substring search (``_matching_tokens``); tests check it
  against difflib on random sequences.

``score`` (in [0, 1]) folds them into one number for sorting and aggregates::

    0                                              if not parse_valid or not status_agree
    1                                              if exact
    (key_jaccard + value_match + text_similarity)/3   if both succeeded
    (error_code_agree + text_similarity) / 2          if both failed

The model-based tier, ``nll_per_token``, is the environment-token cross-entropy: the mean
negative log-likelihood of the *real* response's tokens under the rehearse prompt. It needs the
model, so the engine computes it and hands it to storage through ``Episode.meta["real_nll"]``
(``{call_index: nats_per_token}``); storage stores it next to the other tiers.

``compare`` scores one pair. ``score_pairs`` scores a batch (storage: one step) with exactly
``compare``'s numbers: every tier but the text similarity per pair, then the similarity of each
distinct (predicted, real) pair of texts once — a GRPO group repeats the same real answers —
tokenising each distinct text once and running the matcher once per token-equality pattern
(``{"balance":105}`` vs ``{"balance":100}`` and ``{"balance":7}`` vs ``{"balance":9}`` are
one pattern: difflib only asks whether two tokens are equal, so they match alike).
"""

from __future__ import annotations

import difflib
import enum
import json
import json.encoder
import math
import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

import orjson

from envace_engine.types import MetaKey, ToolResult

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

REL_TOL = 0.01  # numbers within 1 % of each other are the same value
ABS_TOL = 1e-9  # so that 0.0 and float noise around it still match
NLL_META_KEY = MetaKey.REAL_NLL  # Episode.meta: {call_index: nll per token of the real response}


def _json_default(value: Any) -> Any:
    """What canonical JSON makes of the two non-JSON types orjson writes natively.

    orjson writes a UUID as its string and an Enum as its value; json's fallback path does the
    same, so that the canonical text of a value never depends on which path produced it.
    """
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


# One shared encoder: json.dumps would build a new one per call, a large part of the cost here.
_ENCODER = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=_json_default
)
# For a real answer JSON cannot hold (a tool returned a set, a date): its other parts stay JSON
# and each such object is its repr(), so the pair is still compared instead of failing.
_LENIENT = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)
# Canonical JSON has no whitespace, so these alternatives cover every character of it. Each
# alternative starts with its own characters, so their order does not change what matches:
# punctuation comes first because it is the most frequent, and the possessive quantifiers
# (never giving back) find the same tokens as the plain pattern without backtracking.
_JSON_TOKEN = re.compile(
    r'[{}\[\]:,]|"[^"\\]*+(?:\\.[^"\\]*+)*+"|-?\d++(?:\.\d++)?+(?:[eE][+-]?\d++)?+'
    r"|true|false|null|NaN|-?Infinity"
)
_CODE_SPACE = 0x110000  # chr() accepts 0..0x10FFFF: the most distinct tokens of a coded pair
_FIRST_CODES = tuple(map(chr, range(1024)))  # the codes of pairs of up to 1024 tokens
# Tuples, not ``int | float``: a union is built anew at each isinstance call in the hot loop.
_NUMBERS = (int, float)
_SEQUENCES = (list, tuple)

# The fields of ``Fidelity``, in order, as a plain tuple (``Fidelity(*tiers)`` is the value):
# storage builds columns from them and skips a frozen dataclass per pair.
FidelityTiers = tuple[bool, bool, bool | None, bool, float | None, float | None, float, float]


@dataclass(frozen=True)
class Fidelity:
    """All tiers for one (predicted, real) pair. Tiers that cannot apply are None."""

    parse_valid: bool
    status_agree: bool
    error_code_agree: bool | None
    exact: bool
    key_jaccard: float | None
    value_match: float | None
    text_similarity: float
    score: float


NOT_PARSED = Fidelity(False, False, None, False, None, None, 0.0, 0.0)
_NOT_PARSED_TIERS: FidelityTiers = (False, False, None, False, None, None, 0.0, 0.0)


def canonical(result: ToolResult) -> Any:
    """The JSON value a pair is compared on (see the module docstring)."""
    if result.error is None:
        return result.value
    return {"error": {"code": result.error.code, "message": result.error.message}}


def _c_encoder() -> Callable[[Any, int], Any] | None:
    """json's C encoder for canonical JSON, built once (``encode`` builds one per call: half
    its cost).

    Built without the circular-reference check, whose bookkeeping is shared state and costs
    per container: a cycle instead ends in RecursionError, which ``canonical_json`` turns
    into the ValueError json raises for one. None where the C accelerator is missing.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    return make(
        None,  # no circular-reference markers
        _ENCODER.default,
        json.encoder.encode_basestring,  # what ensure_ascii=False uses
        None,  # indent
        _ENCODER.key_separator,
        _ENCODER.item_separator,
        _ENCODER.sort_keys,
        _ENCODER.skipkeys,
        _ENCODER.allow_nan,
    )


_C_ENCODER = _c_encoder()
# orjson refuses (JSONEncodeError, a TypeError) what it would write unlike json: subclasses of
# str/int/dict/list (json writes an IntEnum as int.__repr__), dates and dataclasses (json
# refuses them), non-str keys (json converts them), ints over 64 bits, lone surrogates, and
# nesting deeper than 254.
_ORJSON_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
# In what orjson does write, only floats differ from json's text: NaN and infinities come out
# as ``null`` (json: NaN, Infinity), and below 1e-4 orjson writes 0.00001 or 1.5e-7 where
# Python's repr writes 1e-05 and 1.5e-07. Output that could hold such a number goes to json.
# (Any ``null`` qualifies, None too, and any ``e-`` or ``0.0000`` inside a string: that costs
# time, never correctness.) Three ``bytes.find`` calls take ~3/4 of one regex search's time
# (and ``in``, oddly, more than either).


def _json_canonical(value: Any) -> str:
    if _C_ENCODER is None:
        return _ENCODER.encode(value)
    try:
        return "".join(_C_ENCODER(value, 0))
    except RecursionError as err:
        raise ValueError("circular reference, or nesting too deep for JSON") from err


def canonical_json(value: Any) -> str:
    """Sorted-key, whitespace-free JSON: two equal values give the same string.

    Exactly ``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``,
    except that a UUID is written as its string and an Enum as its value (json refuses both).
    orjson writes most values, in about half json's time with the checks (storage canonicalises
    every call's arguments and answers at every step);
    whatever it refuses or could write differently goes through json (see ``_ORJSON_OPTIONS``).

    Raises TypeError for a value JSON cannot hold, ValueError for a circular (or absurdly
    deeply nested) one.
    """
    try:
        out = orjson.dumps(value, option=_ORJSON_OPTIONS)
    except TypeError:
        out = None  # json decides, outside this handler: its own error is the one to see
    if out is None or out.find(b"null") >= 0 or out.find(b"e-") >= 0 or out.find(b"0.0000") >= 0:
        return _json_canonical(value)
    return out.decode()


def values_equal(a: Any, b: Any, rel_tol: float = REL_TOL) -> bool:
    """Deep equality where numbers may differ by ``rel_tol`` (relative) and bools are exact."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, _NUMBERS) and isinstance(b, _NUMBERS):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k], rel_tol) for k in a)
    if isinstance(a, _SEQUENCES) and isinstance(b, _SEQUENCES):
        if len(a) != len(b):
            return False
        return all(values_equal(x, y, rel_tol) for x, y in zip(a, b, strict=True))
    return a == b


def _as_keyed(value: Any) -> dict[str, Any]:
    # A non-object value is one unnamed field, so key and value tiers still mean something.
    return value if isinstance(value, dict) else {"": value}


def key_jaccard(predicted: Any, real: Any) -> float:
    """Jaccard index of the top-level key sets (1.0 when both are empty)."""
    kp, kr = set(_as_keyed(predicted)), set(_as_keyed(real))
    union = kp | kr
    return 1.0 if not union else len(kp & kr) / len(union)


def value_match(predicted: Any, real: Any, rel_tol: float = REL_TOL) -> float:
    """Fraction of shared top-level keys whose values are equal within tolerance."""
    p, r = _as_keyed(predicted), _as_keyed(real)
    shared = p.keys() & r.keys()
    if not shared:
        return 1.0 if not p and not r else 0.0
    equal = 0
    for key in shared:  # a loop, not sum(generator): this runs for every scored pair
        if values_equal(p[key], r[key], rel_tol):
            equal += 1
    return equal / len(shared)


def json_tokens(text: str) -> list[str]:
    """Lexical tokens of JSON text: strings, numbers, literals and punctuation."""
    return _JSON_TOKEN.findall(text)


def _code_pair(ta: list[str], tb: list[str]) -> tuple[str, str] | None:
    """Both token sequences as strings, one character per token; None past ``_CODE_SPACE``.

    Equal tokens get equal characters, so substring search on the coded pair is run search on
    the token sequences. Codes are numbered by first sight in ``ta`` then ``tb``: two pairs
    that are equal up to renaming tokens get the same coded pair, and difflib (which only asks
    whether two tokens are equal) matches the same number of tokens in both.
    """
    if len(ta) + len(tb) <= len(_FIRST_CODES):  # nearly every pair: no chr() calls
        # dict.fromkeys keeps first-sight order over ``ta`` then ``tb``; every loop here is C.
        code = dict(zip(dict.fromkeys(ta + tb), _FIRST_CODES, strict=False)).__getitem__
        return "".join(map(code, ta)), "".join(map(code, tb))
    distinct = dict.fromkeys(ta + tb)
    if len(distinct) > _CODE_SPACE:
        return None
    codes = dict(zip(distinct, map(chr, range(len(distinct))), strict=True))
    return "".join(map(codes.__getitem__, ta)), "".join(map(codes.__getitem__, tb))


def _leftmost_longest(a: str, b: str) -> tuple[int, int]:
    """``(i, k)``: the longest run ``a[i:i+k]`` that occurs in ``b``, leftmost ``i`` on ties.

    ``k`` only grows, so one substring test per position of ``a`` (plus one per unit of ``k``)
    suffices; the first ``i`` that reaches the final ``k`` is the leftmost, as in difflib.
    """
    n = len(a)
    best = best_i = i = 0
    while i + best < n:
        if a[i : i + best + 1] in b:
            best += 1
            while i + best < n and a[i : i + best + 1] in b:
                best += 1
            best_i = i
        i += 1
    return best_i, best


def _greedy_matches(a: str, b: str) -> int:
    """Difflib's match count when no run longer than one token is shared.

    Then its recursion is a left-to-right scan: the leftmost token of ``a`` found in ``b``
    matches the first such token of ``b``, nothing left of both can match, and the rest repeats.
    """
    matched = position = 0
    find = b.find
    for char in a:
        found = find(char, position)
        if found >= 0:
            matched += 1
            position = found + 1
    return matched


def _matching_tokens(a: str, b: str) -> int:
    """Tokens in difflib's matching blocks of two coded sequences (autojunk off, no junk).

    Difflib takes the longest common run (leftmost in ``a``, then in ``b``) and recurses on both
    sides of it; the count does not depend on the order the sides are visited in.
    """
    total = 0
    todo = [(a, b)]
    while todo:
        a, b = todo.pop()
        if not a or not b:
            continue
        if a == b:
            total += len(a)
            continue
        i, k = _leftmost_longest(a, b)
        if k == 0:
            continue
        if k == 1:
            total += _greedy_matches(a[i:], b)
            continue
        j = b.find(a[i : i + k])  # the leftmost occurrence in b: difflib's tie-break
        total += k
        todo.append((a[:i], b[:j]))
        todo.append((a[i + k :], b[j + k :]))
    return total


def _token_ratio(
    ta: list[str], tb: list[str], memo: dict[tuple[str, str], int] | None = None
) -> float:
    """``difflib.SequenceMatcher(None, ta, tb, autojunk=False).ratio()``, computed faster.

    ``memo`` maps coded pairs (token-equality patterns) to their match counts.
    """
    length = len(ta) + len(tb)
    if not length:
        return 1.0
    coded = _code_pair(ta, tb)
    if coded is None:  # over a million distinct tokens: difflib itself, slowly
        return difflib.SequenceMatcher(None, ta, tb, autojunk=False).ratio()
    matched = None if memo is None else memo.get(coded)
    if matched is None:
        matched = _matching_tokens(*coded)
        if memo is not None:
            memo[coded] = matched
    return 2.0 * matched / length


def _similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    return _token_ratio(json_tokens(a), json_tokens(b))


def similarities(pairs: Sequence[tuple[str, str]]) -> list[float]:
    """The text similarity of each pair of canonical JSON texts: each text tokenised once, and
    each token-equality pattern matched once (pairs that differ only in which value sits where
    share one). Plain strings in, floats out: storage may run it in a helper process."""
    tokens: dict[str, list[str]] = {}
    patterns: dict[tuple[str, str], int] = {}
    out = []
    for a, b in pairs:
        if a == b:
            out.append(1.0)
            continue
        ta, tb = tokens.get(a), tokens.get(b)
        if ta is None:
            ta = tokens[a] = json_tokens(a)
        if tb is None:
            tb = tokens[b] = json_tokens(b)
        out.append(_token_ratio(ta, tb, patterns))
    return out


def text_similarity(predicted: Any, real: Any) -> float:
    """``difflib`` ratio of the two canonical JSON texts, compared token by token."""
    return _similarity(canonical_json(predicted), canonical_json(real))


class _Unscored(NamedTuple):
    """A parse-valid, inexact pair with every tier but the text similarity (and score)."""

    texts: tuple[str, str]
    status_agree: bool
    error_code_agree: bool | None
    key_jaccard: float
    value_match: float
    predicted_ok: bool

    def finish(self, similarity: float) -> FidelityTiers:
        if not self.status_agree:
            score = 0.0
        elif self.predicted_ok:
            score = (self.key_jaccard + self.value_match + similarity) / 3
        else:
            score = (float(bool(self.error_code_agree)) + similarity) / 2
        return (
            True,
            self.status_agree,
            self.error_code_agree,
            False,
            self.key_jaccard,
            self.value_match,
            similarity,
            score,
        )


def _key_tiers(predicted: Any, real: Any) -> tuple[float, float]:
    """``(key_jaccard, value_match)`` in one pass over the two key sets."""
    p, r = _as_keyed(predicted), _as_keyed(real)
    shared = p.keys() & r.keys()
    union = len(p) + len(r) - len(shared)
    jaccard = 1.0 if not union else len(shared) / union
    if not shared:
        return jaccard, (1.0 if not p and not r else 0.0)
    equal = 0
    for key in shared:
        if values_equal(p[key], r[key]):
            equal += 1
    return jaccard, equal / len(shared)


def _real_text(real: ToolResult) -> str:
    """Canonical JSON of the real answer; objects JSON cannot hold become their repr()."""
    value = canonical(real)
    try:
        return canonical_json(value)
    except (TypeError, ValueError):
        return _LENIENT.encode(value)


def _tiers(
    predicted: ToolResult | None, real: ToolResult, texts: tuple[str, str] | None
) -> FidelityTiers | _Unscored:
    """Every tier of one pair, or all but the text similarity when it is inexact."""
    if predicted is None:
        return _NOT_PARSED_TIERS
    if texts is None:
        try:
            p_text = canonical_json(canonical(predicted))
        except (TypeError, ValueError):
            return _NOT_PARSED_TIERS
        texts = (p_text, _real_text(real))
    p_error, r_error = predicted.error, real.error
    status_agree = (p_error is None) == (r_error is None)
    code_agree = None
    if p_error is not None or r_error is not None:
        code_agree = p_error is not None and r_error is not None and p_error.code == r_error.code
    if status_agree and texts[0] == texts[1]:  # exact; an ok value may mimic an error object
        return (True, True, code_agree, True, 1.0, 1.0, 1.0, 1.0)
    jaccard, match = _key_tiers(canonical(predicted), canonical(real))
    return _Unscored(texts, status_agree, code_agree, jaccard, match, p_error is None)


def compare(
    predicted: ToolResult | None, real: ToolResult, texts: tuple[str, str] | None = None
) -> Fidelity:
    """Every tier for one pair; ``predicted`` is None when the rehearsal did not parse.

    ``texts`` may pass the canonical JSON of both sides when the caller already has them
    (storage serialises every result anyway), to skip serialising twice.
    """
    tiers = _tiers(predicted, real, texts)
    if isinstance(tiers, _Unscored):
        tiers = tiers.finish(_similarity(*tiers.texts))
    return Fidelity(*tiers)


Staged = FidelityTiers | _Unscored  # a pair's tiers, or all but its text similarity


def stage_pairs(
    pairs: Sequence[tuple[ToolResult | None, ToolResult, tuple[str, str] | None]],
) -> list[Staged]:
    """Every tier of each ``(predicted, real, texts)`` triple but the costly text similarity
    of inexact pairs: ``score_pairs`` in three parts (``pending_texts``, ``finish_pairs``), so
    a caller can compute the similarities elsewhere meanwhile."""
    return [_tiers(predicted, real, texts) for predicted, real, texts in pairs]


def pending_texts(staged: Sequence[Staged]) -> list[tuple[str, str]]:
    """The distinct text pairs whose similarity ``finish_pairs`` needs, in first-seen order."""
    return list(dict.fromkeys(s.texts for s in staged if isinstance(s, _Unscored)))


def finish_pairs(
    staged: Sequence[Staged], similarity: Mapping[tuple[str, str], float]
) -> list[FidelityTiers]:
    """Each staged pair's tiers, given ``similarity`` for (at least) its ``pending_texts``."""
    return [s.finish(similarity[s.texts]) if isinstance(s, _Unscored) else s for s in staged]


def score_pairs(
    pairs: Sequence[tuple[ToolResult | None, ToolResult, tuple[str, str] | None]],
) -> list[FidelityTiers]:
    """``compare`` for many ``(predicted, real, texts)`` triples, faster; same numbers.

    Returns each pair's tiers as a tuple of ``Fidelity``'s fields in order
    (``Fidelity(*tiers) == compare(predicted, real, texts)``), which is what storage turns
    into columns. The similarity of each distinct pair of texts is computed once, and
    difflib's matching once per token-equality pattern (see the module docstring).
    """
    staged = stage_pairs(pairs)
    texts = pending_texts(staged)
    return finish_pairs(staged, dict(zip(texts, similarities(texts), strict=True)))


def nll_per_token(
    model: PreTrainedModel,
    prompt_ids: list[int] | tuple[int, ...],
    target_ids: list[int] | tuple[int, ...],
    chunk_size: int = 8192,
) -> float:
    """Mean negative log-likelihood (nats per token) of ``target_ids`` after ``prompt_ids``.

    This is the environment-token cross-entropy: feed the rehearse prompt plus the tokens of the
    *real* response and score only the response tokens. Log-probs go through the LM head in
    vocabulary chunks (``envace_engine.logprobs``), so no full ``[L, V]`` logits are built.
    """
    import torch

    from envace_engine.logprobs import completion_logprobs

    if not prompt_ids:
        raise ValueError("nll_per_token needs at least one prompt token to condition on")
    if not target_ids:
        raise ValueError("nll_per_token needs at least one target token to score")
    ids = torch.tensor([list(prompt_ids) + list(target_ids)], dtype=torch.long)
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[0, len(prompt_ids) :] = True
    with torch.no_grad():
        logprobs: torch.Tensor = completion_logprobs(
            model, ids, torch.ones_like(ids), mask, chunk_size=chunk_size
        )
    return float(-logprobs[mask].mean())
