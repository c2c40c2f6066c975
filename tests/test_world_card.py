"""``envace world card``: per-tool figures of a run's rehearsed-vs-real pairs (docs/mcp.md).

A run is written by storage's ``RunWriter`` with pairs built by hand, so every figure is known:

step 0: get_stock rehearsed right (NLL 0.5); remove_stock rehearsed as a success where the real
tool failed (NLL 1.5); remove_stock rehearsed as an error with another message (no NLL).
step 1: get_stock with a wrong value (NLL 1.0); get_stock whose rehearsal did not parse; a
simulated pair and a real-only call (neither counts).

get_stock: 3 pairs, exact 1/3, status 2/3, no real error, NLL (0.5 + 1.0) / 2 over 2 pairs.
remove_stock: 2 pairs, exact 0, status 1/2, recall 1 of 2 real errors, NLL 1.5 over 1 pair.
All: 5 pairs, exact 1/5, status 3/5, recall 1/2, NLL (0.5 + 1.5 + 1.0) / 3 = 1.0 over 3.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from envace_engine.cli import app
from envace_engine.cli.world_card import CardSource, PairRow, figures, world_card
from envace_engine.types import (
    CallRecord,
    Episode,
    MetaKey,
    Mode,
    ToolCall,
    ToolError,
    ToolResult,
)
from storage.shards import RunWriter

pytestmark = pytest.mark.timeout(120)

RUNNER = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"})
GET = ToolCall("get_stock", {"item": "figs"})
REMOVE = ToolCall("remove_stock", {"item": "figs", "units": 20})
FIVE = ToolResult(value={"item": "figs", "units": 5})
REFUSED = ToolResult(error=ToolError("TOOL_EXECUTION_ERROR", "only 5 in stock"))


def _rec(call: ToolCall, shown: str = "rehearsed", **answers: ToolResult | None) -> CallRecord:
    return CallRecord(0, 1, call, shown, **answers)


def _episode(name: str, calls: tuple[CallRecord, ...], nll: dict[int, float]) -> Episode:
    meta = {MetaKey.REAL_NLL: nll}
    return Episode(name, "t", "toy", Mode.REHEARSAL, name, (), calls=calls, meta=meta)


def _make_run(root: Path, model: str) -> str:
    writer = RunWriter.create(
        root, "eval", model=model, suite="toy", config={"split": "validation"}, run_id="ev-1"
    )
    first = (
        _rec(GET, rehearsed=FIVE, real=FIVE),
        _rec(REMOVE, rehearsed=ToolResult(value={"item": "figs", "units": 0}), real=REFUSED),
        _rec(
            REMOVE,
            rehearsed=ToolResult(error=ToolError("TOOL_EXECUTION_ERROR", "no figs")),
            real=REFUSED,
        ),
    )
    second = (
        _rec(GET, rehearsed=ToolResult(value={"item": "figs", "units": 4}), real=FIVE),
        _rec(GET, rehearsed=None, real=FIVE),  # the rehearsal did not parse
        _rec(GET, "simulated", simulated=FIVE, real=FIVE),
        _rec(GET, "real", real=FIVE),
    )
    writer.episodes(0, [_episode("a", first, {0: 0.5, 1: 1.5})])
    writer.episodes(1, [_episode("b", second, {0: 1.0})])
    writer.finish("done")
    return writer.run_id


def _checkpoint(tmp_path: Path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text("{}")  # what makes a folder a checkpoint
    return folder


def _by_tool(card: dict) -> dict[str, dict]:
    return {t["tool"]: t for t in card["tools"]}


def test_the_card_beside_the_checkpoint_has_hand_computed_figures(tmp_path):
    ckpt = _checkpoint(tmp_path)
    root = tmp_path / "data"
    run_id = _make_run(root, str(ckpt))
    result = RUNNER.invoke(app, ["world", "card", "--run", run_id, "--root", str(root)])
    assert result.exit_code == 0, result.output
    card = json.loads((ckpt / "world_card.json").read_text())
    get, remove = _by_tool(card)["get_stock"], _by_tool(card)["remove_stock"]
    assert get["pairs"] == 3 and get["exact"] == pytest.approx(1 / 3)
    assert get["status_agree"] == pytest.approx(2 / 3)
    assert get["real_errors"] == 0 and get["error_recall"] is None
    assert get["real_nll"] == pytest.approx(0.75) and get["nll_pairs"] == 2
    assert remove["pairs"] == 2 and remove["exact"] == 0 and remove["status_agree"] == 0.5
    assert remove["real_errors"] == 2 and remove["error_recall"] == 0.5
    assert remove["real_nll"] == pytest.approx(1.5) and remove["nll_pairs"] == 1
    overall = card["overall"]
    assert (overall["pairs"], overall["real_errors"]) == (5, 2)
    assert overall["exact"] == pytest.approx(0.2) and overall["status_agree"] == pytest.approx(0.6)
    assert overall["error_recall"] == 0.5 and overall["real_nll"] == pytest.approx(1.0)
    assert card["source"] == {
        "run_id": "ev-1",
        "kind": "eval",
        "model": str(ckpt),
        "suite": "toy",
        "split": "validation",
        "steps": [0, 1],
    }
    markdown = (ckpt / "world_card.md").read_text()
    assert "| remove_stock | 2 | 0.000 | 0.500 | 0.500 of 2 | 1.500 (1) |" in markdown
    assert "| get_stock | 3 | 0.333 | 0.667 | – | 0.750 (2) |" in markdown


def test_out_names_the_files_and_a_run_dir_is_accepted(tmp_path):
    run_id = _make_run(tmp_path / "data", "tiny")  # a registry name: no checkpoint folder
    run_dir = tmp_path / "data" / "runs" / run_id
    out = tmp_path / "cards" / "tiny-world.md"
    result = RUNNER.invoke(app, ["world", "card", "--run", str(run_dir), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert out.is_file() and (tmp_path / "cards" / "tiny-world.json").is_file()
    # without --out, a run of a model that is no folder here gets the card in its run folder
    result = RUNNER.invoke(app, ["world", "card", "--run", str(run_dir)])
    assert result.exit_code == 0, result.output
    assert (run_dir / "world_card.json").is_file()


def test_a_run_without_rehearsed_pairs_is_refused(tmp_path):
    writer = RunWriter.create(tmp_path, "eval", model="tiny", suite="toy", run_id="real-only")
    writer.episodes(0, [_episode("r", (_rec(GET, "real", real=FIVE),), {})])
    writer.finish("done")
    result = RUNNER.invoke(app, ["world", "card", "--run", "real-only", "--root", str(tmp_path)])
    assert result.exit_code != 0
    assert "no rehearsed-vs-real pairs" in result.output


@pytest.mark.timeout(10)
def test_figures_are_pure_over_pair_rows():
    rows = [
        PairRow("t", 0, True, True, "error", "error", None),
        PairRow("t", 2, False, False, None, "error", 2.0),
    ]
    got = figures("t", rows)
    assert (got.pairs, got.exact, got.error_recall, got.real_nll) == (2, 0.5, 0.5, 2.0)
    card = world_card(rows, CardSource("r", "eval", "m", "s", None, (0, 2)))
    assert card.overall.tool == "*" and [t.tool for t in card.tools] == ["t"]
