"""The product as a new user meets it: the studio started on an empty folder (the bundled demo is
copied in), and on a folder holding one run of every schema version; every page must show data,
not an empty table or a message blaming the data. Screenshots of every demo page go to
docs/screenshots/demo-*.png."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, open_page, shot

pytestmark = pytest.mark.browser

ENVACE = "study-toy--envace"
ACT_ONLY = "study-toy--act-only"
SWEEP = "study-toy--eval-envace"
FIXTURES = Path(__file__).parent / "fixtures" / "schema"


def visible(page, selector: str, text: str) -> None:
    """Wait until ``text`` shows inside ``selector``."""
    found = page.locator(selector).get_by_text(text).filter(visible=True).first
    found.wait_for(timeout=LOAD_MS)


def first_episode(run: Path) -> str:
    """The id of a run folder's first stored episode."""
    import pyarrow.parquet as pq

    shard = sorted((run / "episodes").glob("*.parquet"))[0]
    return str(pq.read_table(shard, columns=["episode_id"])["episode_id"][0])


def no_error_pill(page) -> None:
    """Gradio shows a handler's exception as a toast: there must be none."""
    assert page.locator(".toast-body.error").count() == 0


def test_the_bundled_demo_shows_data_on_every_page(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_DEMO", "1")
    with studio_server(tmp_path) as url, chromium_page() as page:
        page.set_viewport_size({"width": 1400, "height": 900})
        open_page(page, url, "?tab=home")
        visible(page, "#home-overview", "run(s)")
        shot(page, "demo-home")

        open_page(page, url, "?tab=study&study=study-toy")
        visible(page, "#study-table", "envace")
        page.locator("#study-curves .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "demo-study")

        open_page(page, url, "?tab=runs")
        visible(page, "#runs-table", ENVACE)
        choose(page, "run-pick", ENVACE)
        page.locator("#runs-page .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "demo-runs")

        open_page(page, url, f"?tab=inspector&run={ENVACE}&episode=s37r0-3-1")
        visible(page, "#insp-summary", ENVACE)
        visible(page, "#insp-chat", "tool call 0")
        shot(page, "demo-inspector")

        open_page(page, url, "?tab=compare")
        choose(page, "cmp-run", ENVACE)
        visible(page, "#pairs-table", "s37r0-")
        page.locator("#compare-page .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "demo-compare")

        open_page(page, url, f"?tab=annotate&run={ENVACE}")
        visible(page, "#queue-head", "s3")
        shot(page, "demo-annotate")

        open_page(page, url, "?tab=budget")
        choose(page, "bud-pick", SWEEP)
        page.locator("#bud-chart .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "demo-budget")

        open_page(page, url, f"?tab=runs-compare&runs={ENVACE},{ACT_ONLY}")
        page.locator("#cmp-plot .vega-embed").first.wait_for(timeout=LOAD_MS)
        visible(page, "#cmp-tasks", "toy-")
        shot(page, "demo-runs-compare")

        open_page(page, url, f"?tab=rehearse&run={ENVACE}&episode=s37r0-3-1")
        visible(page, "#reh-model", "")
        shot(page, "demo-rehearse")
        no_error_pill(page)
    log = (tmp_path / "studio.log").read_text()
    assert "not indexing" not in log and "skipping run folder" not in log, log[-2000:]


def test_one_run_of_every_schema_version_shows_on_the_data_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_DEMO", "0")
    runs = [p for p in sorted(FIXTURES.glob("v*/schema-v*"))]
    for run in runs:
        shutil.copytree(run, tmp_path / "runs" / run.name)
    with studio_server(tmp_path) as url, chromium_page() as page:
        for run in runs:
            open_page(page, url, "?tab=compare")
            choose(page, "cmp-run", run.name)
            visible(page, "#pairs-table", "/0")
            open_page(page, url, f"?tab=annotate&run={run.name}")
            visible(page, "#queue-head", "/")
            open_page(page, url, f"?tab=inspector&run={run.name}")
            visible(page, "#episode-list", first_episode(run))
        no_error_pill(page)
    log = (tmp_path / "studio.log").read_text()
    assert "not indexing" not in log, log[-2000:]
