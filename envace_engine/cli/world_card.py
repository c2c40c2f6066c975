"""``envace world card``: a fidelity card of a checkpoint's world role, from a run's pairs.

The pairs are the run's stored (rehearsed, real) calls, read through storage's ``pairs`` verb
(the rows the studio's "Rehearsed vs real" page lists, with the tiers storage scored when the
run was written). Only ``rehearsed`` pairs count: a ``simulated`` pair's prediction came from a
frozen simulator, not from this checkpoint's world role. Per tool, and over all tools:

* ``pairs``; ``exact`` (canonical JSON equal) and ``status_agree`` (both succeeded or both
  failed), as shares of the pairs; an unparseable rehearsal counts as neither;
* ``error_recall``: of the pairs whose real call failed, the share rehearsed as an error
  (``None`` when the real tool never failed: there was nothing to recall);
* ``real_nll``: the mean NLL (nats per token) of the real response under the policy, over the
  pairs where it was stored (``None`` when none was).

The card goes beside the checkpoint the pairs describe (``checkpoint_dir``), else in the run
folder, as ``world_card.md`` and ``world_card.json``. The aggregation is pure (``world_card``
over ``PairRow``s); only ``read_pairs`` touches storage, which the CLI, the composition root,
may import.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from envace_engine.adapters import split_name
from envace_engine.models import is_local_model
from envace_engine.training.checkpoint import list_checkpoints

CARD_NAME = "world_card"
REHEARSED = "rehearsed"
_PAGE = 1000  # pairs per storage read


@dataclass(frozen=True)
class PairRow:
    """One stored rehearsed-vs-real pair, as the card reads it."""

    tool: str
    step: int
    exact: bool
    status_agree: bool
    rehearsed_status: str | None  # "ok" | "error" | None (the rehearsal did not parse)
    real_status: str | None
    real_nll: float | None = None


@dataclass(frozen=True)
class ToolFigures:
    """The card's figures for one tool (or ``*`` for all)."""

    tool: str
    pairs: int
    exact: float
    status_agree: float
    real_errors: int
    error_recall: float | None
    real_nll: float | None
    nll_pairs: int


@dataclass(frozen=True)
class CardSource:
    """Where the pairs come from."""

    run_id: str
    kind: str
    model: str
    suite: str
    split: str | None
    steps: tuple[int, ...]


@dataclass(frozen=True)
class WorldCard:
    source: CardSource
    tools: tuple[ToolFigures, ...]
    overall: ToolFigures


def figures(tool: str, rows: Sequence[PairRow]) -> ToolFigures:
    """The figures of ``rows`` (at least one)."""
    n = len(rows)
    errors = [r for r in rows if r.real_status == "error"]
    recalled = sum(r.rehearsed_status == "error" for r in errors)
    nlls = [r.real_nll for r in rows if r.real_nll is not None]
    return ToolFigures(
        tool=tool,
        pairs=n,
        exact=sum(r.exact for r in rows) / n,
        status_agree=sum(r.status_agree for r in rows) / n,
        real_errors=len(errors),
        error_recall=recalled / len(errors) if errors else None,
        real_nll=sum(nlls) / len(nlls) if nlls else None,
        nll_pairs=len(nlls),
    )


def world_card(rows: Sequence[PairRow], source: CardSource) -> WorldCard:
    """Per-tool figures (by tool name) and the overall ones; ``rows`` must not be empty."""
    if not rows:
        raise ValueError(f"run {source.run_id!r} has no rehearsed-vs-real pairs")
    tools = sorted({r.tool for r in rows})
    per_tool = tuple(figures(t, [r for r in rows if r.tool == t]) for t in tools)
    return WorldCard(source, per_tool, figures("*", rows))


def card_json(card: WorldCard) -> dict[str, Any]:
    """The card as JSON-ready data."""
    return {
        "source": {**asdict(card.source), "steps": list(card.source.steps)},
        "tools": [asdict(t) for t in card.tools],
        "overall": asdict(card.overall),
    }


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}"


def _row(f: ToolFigures) -> str:
    recall = "–" if f.error_recall is None else f"{f.error_recall:.3f} of {f.real_errors}"
    nll = "–" if f.real_nll is None else f"{f.real_nll:.3f} ({f.nll_pairs})"
    cells = [f.tool, str(f.pairs), _share(f.exact), _share(f.status_agree), recall, nll]
    return "| " + " | ".join(cells) + " |"


def _steps_text(steps: Sequence[int]) -> str:
    if not steps:
        return "none"
    if list(steps) == list(range(steps[0], steps[-1] + 1)) and len(steps) > 2:
        return f"{steps[0]}–{steps[-1]}"
    return ", ".join(map(str, steps))


def card_markdown(card: WorldCard) -> str:
    """The card as a Markdown page."""
    s = card.source
    lines = [
        f"# World-role fidelity card: {s.model or s.run_id}",
        "",
        f"Pairs: run `{s.run_id}` ({s.kind}), suite `{s.suite}`, split "
        f"`{s.split or 'not recorded'}`, steps {_steps_text(s.steps)}. Rehearsed pairs only; "
        "error recall: real errors rehearsed as errors; NLL: nats per token of the real "
        "response (pairs that stored it).",
        "",
        "| tool | pairs | exact | status agree | error recall | real NLL |",
        "|---|---|---|---|---|---|",
        *(_row(t) for t in card.tools),
        _row(card.overall).replace("| * |", "| **all** |", 1),
        "",
    ]
    return "\n".join(lines)


def card_paths(base: Path) -> tuple[Path, Path]:
    """``BASE.md`` and ``BASE.json`` (a given ``.md``/``.json`` suffix is replaced)."""
    stem = base.with_suffix("") if base.suffix in (".md", ".json") else base
    return stem.with_name(stem.name + ".md"), stem.with_name(stem.name + ".json")


def write_card(card: WorldCard, base: Path) -> tuple[Path, Path]:
    """Write the Markdown and JSON files; their paths."""
    md, js = card_paths(base)
    md.parent.mkdir(parents=True, exist_ok=True)
    md.write_text(card_markdown(card), encoding="utf-8")
    js.write_text(json.dumps(card_json(card), indent=2) + "\n", encoding="utf-8")
    return md, js


# -- reading a run (storage) --------------------------------------------------------------------


def _flag(value: Any) -> bool:
    """A stored tier flag; a missing one (NULL/NaN) is not agreement."""
    return bool(value) if _present(value) else False


def _present(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _text(value: Any) -> str | None:
    return str(value) if _present(value) else None


def pair_rows(records: Iterable[dict[str, Any]]) -> list[PairRow]:
    """The rehearsed pairs among storage's pair rows."""
    return [
        PairRow(
            tool=str(r["tool"]),
            step=int(r["step"]),
            exact=_flag(r["exact"]),
            status_agree=_flag(r["status_agree"]),
            rehearsed_status=_text(r["rehearsed_status"]),
            real_status=_text(r["real_status"]),
            real_nll=float(r["real_nll"]) if _present(r["real_nll"]) else None,
        )
        for r in records
        if r["pair_source"] == REHEARSED
    ]


def read_pairs(store: Any, run_id: str) -> list[PairRow]:
    """Every rehearsed pair of ``run_id``, page by page through ``Store.pairs``."""
    rows: list[PairRow] = []
    offset = 0
    while True:
        page = store.pairs(run_id=run_id, limit=_PAGE, offset=offset)
        rows += pair_rows(page.to_dict("records"))
        if len(page) < _PAGE:
            return rows
        offset += _PAGE


def card_source(manifest: Any, rows: Sequence[PairRow]) -> CardSource:
    """The run's identity from its manifest (``split`` as its config recorded it)."""
    split = manifest.config.get("split")
    return CardSource(
        run_id=manifest.run_id,
        kind=manifest.kind,
        model=manifest.model,
        suite=manifest.suite,
        split=str(split) if split is not None else None,
        steps=tuple(sorted({r.step for r in rows})),
    )


def checkpoint_dir(manifest: Any, run_path: Path) -> Path | None:
    """The checkpoint whose world role the run's pairs show, when it is a folder here.

    A training run rehearsed with the weights it trained: its newest checkpoint (``train``) or
    its saved model (``sft``: ``out_dir``, default ``<run>/model``). Any other run rehearsed
    with its ``model``: that folder (an adapter's, for ``BASE+ADAPTER``).
    """

    if manifest.kind == "train":
        found = list_checkpoints(run_path)
        return found[-1] if found else None
    if manifest.kind == "sft":
        out = manifest.config.get("out_dir")
        folder = Path(out) if out else run_path / "model"
        return folder if folder.is_dir() else None
    if manifest.model and is_local_model(manifest.model):
        return split_name(manifest.model)[1]
    return None
