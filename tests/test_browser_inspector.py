"""Trajectory inspector in a real browser: a deep link opens an episode with nested rehearsals."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_deep_link_opens_episode_with_nested_rehearsal(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=inspector&episode=ep-0-1")
        chat = page.locator("#insp-chat")
        chat.get_by_text("tool call 1: ship").wait_for(timeout=LOAD_MS)
        # the rehearsed answer and the real one sit under the call they answer
        call = chat.locator("div", has_text="tool call 1: ship").last
        call.get_by_text("rehearsed response").first.wait_for(state="visible", timeout=LOAD_MS)
        chat.get_by_text("only 40 bolts in stock").first.wait_for(state="visible", timeout=LOAD_MS)
        tokens = page.locator("#insp-tokens")  # its own component: may render a moment later
        tokens.get_by_text("rehearse (trained)").first.wait_for(state="visible", timeout=LOAD_MS)
        page.get_by_text("8 episode(s) · page 1 of 1").wait_for(timeout=LOAD_MS)
        shot(page, "inspector")
        page.locator("#insp-next-failure").click()
        page.locator("#insp-summary").get_by_text("ep-0-3").wait_for(timeout=LOAD_MS)
