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
* ``text_similarity`` — ``difflib.SequenceMatcher.ratio`` over the two canonical JSON texts,
  compared as sequences of JSON tokens (strings, numbers, literals, punctuation) rather than
  characters: the same diff a reader sees, and ~10x cheaper, which matters because storage
  scores every pair at write time.

``score`` (in [0, 1]) folds them into one number for sorting and aggregates::

    0                                              if not parse_valid or not status_agree
    1                                              if exact
    (key_jaccard + value_match + text_similarity)/3   if both succeeded
    (error_code_agree + text_similarity) / 2          if both failed

The model-based tier, ``nll_per_token``, is the environment-token cross-entropy: the mean
negative log-likelihood of the *real* response's tokens under the rehearse prompt. It needs the
model, so the engine computes it and hands it to storage through ``Episode.meta["real_nll"]``
(``{call_index: nats_per_token}``); storage stores it next to the other tiers.
"""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from envace_engine.types import ToolResult

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel

REL_TOL = 0.01  # numbers within 1 % of each other are the same value
ABS_TOL = 1e-9  # so that 0.0 and float noise around it still match
NLL_META_KEY = "real_nll"  # Episode.meta key: {call_index: nll per token of the real response}
# One shared encoder: json.dumps would build a new one per call, a third of the cost here.
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
# Canonical JSON has no whitespace, so these alternatives cover every character of it.
_JSON_TOKEN = re.compile(
    r'"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null|NaN|-?Infinity|[{}\[\]:,]'
)


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


def canonical(result: ToolResult) -> Any:
    """The JSON value a pair is compared on (see the module docstring)."""
    if result.error is None:
        return result.value
    return {"error": {"code": result.error.code, "message": result.error.message}}


def canonical_json(value: Any) -> str:
    """Sorted-key, whitespace-free JSON: two equal values give the same string."""
    return _ENCODER.encode(value)


def values_equal(a: Any, b: Any, rel_tol: float = REL_TOL) -> bool:
    """Deep equality where numbers may differ by ``rel_tol`` (relative) and bools are exact."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=rel_tol, abs_tol=ABS_TOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(values_equal(a[k], b[k], rel_tol) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
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
    return sum(values_equal(p[k], r[k], rel_tol) for k in shared) / len(shared)


def json_tokens(text: str) -> list[str]:
    """Lexical tokens of JSON text: strings, numbers, literals and punctuation."""
    return _JSON_TOKEN.findall(text)


def _similarity(a: str, b: str) -> float:
    if a == b:
        return 1.0
    ta, tb = json_tokens(a), json_tokens(b)
    if not ta and not tb:
        return 1.0
    return difflib.SequenceMatcher(None, ta, tb, autojunk=False).ratio()


def text_similarity(predicted: Any, real: Any) -> float:
    """``difflib`` ratio of the two canonical JSON texts, compared token by token."""
    return _similarity(canonical_json(predicted), canonical_json(real))


def compare(
    predicted: ToolResult | None, real: ToolResult, texts: tuple[str, str] | None = None
) -> Fidelity:
    """Every tier for one pair; ``predicted`` is None when the rehearsal did not parse.

    ``texts`` may pass the canonical JSON of both sides when the caller already has them
    (storage serialises every result anyway), to skip serialising twice.
    """
    if predicted is None:
        return NOT_PARSED
    p, r = canonical(predicted), canonical(real)
    if texts is not None:
        p_text, r_text = texts
    else:
        try:
            p_text = canonical_json(p)
        except (TypeError, ValueError):
            return NOT_PARSED
        r_text = canonical_json(r)
    status_agree = predicted.ok == real.ok
    exact = status_agree and p_text == r_text  # an ok value may mimic an error object
    code_agree = None
    if predicted.error is not None or real.error is not None:
        code_agree = (
            predicted.error is not None
            and real.error is not None
            and predicted.error.code == real.error.code
        )
    if exact:
        return Fidelity(True, True, code_agree, True, 1.0, 1.0, 1.0, 1.0)
    jaccard, match, similarity = key_jaccard(p, r), value_match(p, r), _similarity(p_text, r_text)
    if not status_agree:
        score = 0.0
    elif predicted.ok:
        score = (jaccard + match + similarity) / 3
    else:
        score = (float(bool(code_agree)) + similarity) / 2
    return Fidelity(True, status_agree, code_agree, False, jaccard, match, similarity, score)


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
