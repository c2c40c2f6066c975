"""Fuzzy matching as upstream does it, with the same library (``thefuzz``), so rankings agree.

Every search and look-up ranks documents by ``fuzz.partial_ratio`` through
``process.extract(query, docs, limit=None)``: thefuzz lower-cases both sides and turns anything
that is not a letter or digit into a space (its default processor), scores each document by
its best-matching substring, and sorts by score, ties in document order. Documents with the same
text get ``-`` suffixes first (upstream's ``rerank``), so every id keeps its own entry. Searches
keep the top 50 (``TOP_K``); nothing is cut off by score, so a search always answers with every
provider or product of a small task, best first.
"""

from __future__ import annotations

from collections.abc import Mapping

from thefuzz import fuzz, process  # type: ignore[import-untyped]

TOP_K = 50


def rank(query: str, docs: Mapping[str, str]) -> list[tuple[str, int]]:
    """Document ids with their scores (0–100), best first (upstream's ``rerank``)."""
    owners: dict[str, str] = {}  # document text (made unique) -> id
    for key, text in docs.items():
        while text in owners:
            text += "-"
        owners[text] = key
    ranked = process.extract(query, list(owners), limit=None, scorer=fuzz.partial_ratio)
    return [(owners[text], int(score)) for text, score in ranked]


def top(query: str, docs: Mapping[str, str]) -> list[str]:
    """The ids of the ``TOP_K`` best documents."""
    return [key for key, _ in rank(query, docs)[:TOP_K]]


def best(query: str, docs: Mapping[str, str]) -> tuple[str, int] | None:
    """The best document's id and score, or None when there are no documents."""
    ranked = rank(query, docs)
    return ranked[0] if ranked else None


def ratio(a: str, b: str) -> int:
    """thefuzz's plain ``ratio`` (no processing), the geocoder's second test."""
    return int(fuzz.ratio(a, b))
