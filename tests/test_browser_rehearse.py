"""Live rehearse in a real browser: the embedded (tiny) model rehearses a stored call."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, fill, open_page, shot
from tests.studio_data import make_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]
MODEL_MS = 120_000  # first request starts the worker and loads the model


def test_live_rehearsal_beside_the_real_response(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=rehearse")
        fill(page, "reh-episode", "ep-0-1")
        page.locator("#reh-load").click()
        page.get_by_text("2 rehearsed call(s)").wait_for(timeout=MODEL_MS)
        fill(page, "reh-index", "1")
        choose(page, "reh-model", "tiny")
        page.locator("#reh-go").click()
        page.locator("#reh-timing").get_by_text("tokens in").wait_for(timeout=MODEL_MS)
        # the run's own model answered (step 0 of a "tiny" run), and the page says which
        assert "Answers: tiny" in page.locator("#reh-timing").inner_text()
        page.get_by_text("only 40 bolts in stock").first.wait_for(state="visible", timeout=LOAD_MS)
        shot(page, "rehearse")
