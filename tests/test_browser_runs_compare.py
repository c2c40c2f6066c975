"""Run comparison in a real browser: shared curves, who solved each task, both episodes."""

from __future__ import annotations

import pytest

from storage import Store
from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_two_runs_render_side_by_side(tmp_path):
    make_run(tmp_path, "run-a", steps=2)
    make_run(tmp_path, "run-b", steps=3)
    store = Store(tmp_path)
    outcomes = store.comparison.task_outcomes(["run-a", "run-b"])
    store.close()
    assert list(outcomes.columns) == ["task_id", "run-a", "run-b"] and len(outcomes) == 3
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=runs-compare&runs=run-a,run-b")
        page.locator("#cmp-plot .vega-embed").first.wait_for(timeout=LOAD_MS)
        message = page.locator("#cmp-message")
        message.get_by_text("A = run-a").wait_for(timeout=LOAD_MS)
        table = page.locator("#cmp-tasks")
        table.get_by_text("warehouse-0", exact=True).filter(visible=True).first.click()
        page.locator("#cmp-head-a").get_by_text("run-a").first.wait_for(timeout=LOAD_MS)
        page.locator("#cmp-head-b").get_by_text("run-b").first.wait_for(timeout=LOAD_MS)
        # episode ids repeat across the two runs: each side shows its own run's episode
        page.locator("#cmp-head-b").get_by_text("run run-b").first.wait_for(timeout=LOAD_MS)
        for side in ("a", "b"):
            chat = page.locator(f"#cmp-chat-{side}")
            chat.get_by_text("Shipped 500 bolts.").first.wait_for(timeout=LOAD_MS)
        shot(page, "compare-runs")
