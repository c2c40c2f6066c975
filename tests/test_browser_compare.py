"""Rehearsed vs real in a real browser: pick a pair, see the side-by-side diff and aggregates."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_pair_diff_and_confusion_matrix(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=compare")
        table = page.locator("#pairs-table")
        cell = table.get_by_text("ep-0-1/1", exact=True).filter(visible=True).first
        cell.wait_for(timeout=LOAD_MS)
        cell.click()
        diff = page.locator("#pair-diff")
        diff.get_by_text("only 40 bolts in stock").wait_for(timeout=LOAD_MS)
        assert diff.locator("td.del").count() >= 1  # the rehearsed side differs from the real one
        page.locator("#pair-head").get_by_text("status ok vs error").wait_for(timeout=LOAD_MS)
        # vega draws on a canvas: wait for the chart to be embedded
        page.locator("#cmp-confusion .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "compare")
