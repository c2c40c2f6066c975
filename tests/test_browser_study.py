"""The Study page in a real browser: verdicts, the test-time table, curves on shared axes."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, open_page, shot
from tests.studio_data import make_study

pytestmark = pytest.mark.browser


def test_study_page_shows_table_curves_and_verdicts(tmp_path):
    make_study(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=study&study=study-demo")
        verdicts = page.locator("#study-verdicts")
        verdicts.get_by_text("(e) target").wait_for(timeout=LOAD_MS)
        table = page.locator("#study-table")
        table.get_by_text("parallel N=2").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        world = page.locator("#study-world").get_by_text("shared-baseline")
        world.filter(visible=True).first.wait_for(timeout=LOAD_MS)
        choose(page, "study-curve", "held-out fidelity exact")
        page.locator("#study-curves .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "study")
