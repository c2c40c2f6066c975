"""Click-through in a real browser: a pairs-table row lands in the inspector on its episode, and
the inspector's link opens Live rehearse with that episode's calls listed — no typed ids."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, open_page
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_a_row_click_lands_in_the_inspector_then_live_rehearse(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=compare")
        table = page.locator("#pairs-table")
        table.get_by_text("ep-0-1/1", exact=True).filter(visible=True).first.wait_for(
            timeout=LOAD_MS
        )
        # rows in run order: ep-0-0/0, ep-0-0/1, ep-0-1/0, ep-0-1/1 — the fourth row's cell
        table.get_by_text("inspector ↗").filter(visible=True).nth(3).click()
        page.wait_for_url("**tab=inspector**episode=ep-0-1", timeout=LOAD_MS)
        assert "run=train-demo" in page.url  # the listed run's episode: ids repeat across runs
        summary = page.locator("#insp-summary")
        summary.get_by_text("ep-0-1").first.wait_for(timeout=LOAD_MS)
        page.locator("#insp-chat").get_by_text("tool call 1: ship").first.wait_for(timeout=LOAD_MS)
        with page.expect_popup() as opened:  # gradio opens Markdown links in a new tab
            page.locator("#insp-link").get_by_text("live rehearse its calls").click()
        page = opened.value
        page.wait_for_url("**tab=rehearse**", timeout=LOAD_MS)
        box = page.locator("#reh-episode textarea, #reh-episode input").first
        page.wait_for_function(
            "() => { const b = document.querySelector('#reh-episode textarea, #reh-episode input');"
            " return b && b.value === 'ep-0-1'; }",
            timeout=LOAD_MS,
        )
        assert box.input_value() == "ep-0-1"
        run = page.locator("#reh-run textarea, #reh-run input").first
        assert run.input_value() == "train-demo"
