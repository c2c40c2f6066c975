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


def test_an_episodes_sixth_label_has_a_key(tmp_path):
    """The inspector's "label it" link opens the form on that run's episode; key 6 reaches the
    sixth episode label, and a save clears the note."""
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=annotate&run=train-demo&episode=ep-0-1")
        label = page.locator("#annot-label")
        label.get_by_text("6 · other").wait_for(timeout=LOAD_MS)
        fill(page, "annot-note", "a plan that never checks the stock")
        page.locator("body").click(position={"x": 5, "y": 5})  # leave the note: keys label now
        page.keyboard.press("6")
        page.keyboard.press("Control+Enter")
        message = page.locator("#annot-message")
        message.get_by_text("Saved other on").wait_for(timeout=LOAD_MS)
        assert "train-demo" in message.inner_text()  # the label names its run
        note = page.locator("#annot-note textarea").first
        page.wait_for_function(
            "() => document.querySelector('#annot-note textarea').value === ''", timeout=LOAD_MS
        )
        assert note.input_value() == ""
