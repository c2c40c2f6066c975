"""Annotate in a real browser: read-only until sign-in, keyboard labelling, history after reload."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, fill, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_annotation_survives_reload(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path, ("--auth", "ana:s3cret")) as url, chromium_page() as page:
        open_page(page, url, "?tab=annotate&call=ep-0-1/1")
        page.get_by_text("Browsing read-only").wait_for(timeout=LOAD_MS)
        page.locator("#annot-label").get_by_text("hallucinated-success").click()
        page.locator("#annot-save").click()
        page.locator("#annot-message").get_by_text("read-only: sign in").wait_for(timeout=LOAD_MS)

        page.locator("#sign-in").get_by_text("Sign in").first.click()
        fill(page, "sign-in-user", "ana")
        fill(page, "sign-in-pass", "s3cret")
        page.locator("#sign-in-button").click()
        page.get_by_text("Signed in as").wait_for(timeout=LOAD_MS)

        fill(page, "annot-note", "claims shipped; real tool refused")
        page.locator("body").click(position={"x": 5, "y": 5})  # leave the note: keys label now
        page.keyboard.press("3")  # third label: hallucinated-success
        page.keyboard.press("Control+Enter")
        page.locator("#annot-message").get_by_text("Saved hallucinated-success").wait_for(
            timeout=LOAD_MS
        )

        page.reload()
        page.get_by_text("EnvACE Studio").first.wait_for(timeout=LOAD_MS)
        history = page.locator("#annot-history")
        history.get_by_text("hallucinated-success").filter(visible=True).first.wait_for(
            timeout=LOAD_MS
        )
        assert history.get_by_text("ana", exact=True).filter(visible=True).count() == 1
        note = history.get_by_text("claims shipped; real tool refused").filter(visible=True)
        assert note.count() == 1
        shot(page, "annotate")
