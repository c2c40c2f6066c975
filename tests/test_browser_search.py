"""Search in a real browser: a seeded phrase is found, marked, and its episode opens on click."""

from __future__ import annotations

import dataclasses

import pytest

from envace_engine.types import Role
from storage.shards import RunWriter
from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, fill, open_page, shot
from tests.studio_data import episode, seg

pytestmark = pytest.mark.browser
PHRASE = "the crate is on fire"


def _seeded_run(root) -> str:
    """Six episodes; only ep-0-4's final answer holds the phrase."""
    writer = RunWriter.create(root, "train", model="tiny", suite="toy", run_id="seeded")
    eps = [episode(i, 0, 1.0) for i in range(6)]
    answer = seg(Role.ACT, f"Stop: {PHRASE}, nothing shipped.", (15, 16))
    eps[4] = dataclasses.replace(eps[4], segments=(*eps[4].segments[:-1], answer))
    writer.episodes(0, eps)
    writer.finish("done")
    return "ep-0-4"


def test_a_search_finds_the_phrase_and_opens_its_episode(tmp_path):
    target = _seeded_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=inspector&run=seeded")
        page.locator("#episode-list").get_by_text(target).first.wait_for(timeout=LOAD_MS)
        fill(page, "insp-search", "CRATE is on")
        page.locator("#insp-search-go").click()
        page.locator("#insp-search-message").get_by_text("match").wait_for(timeout=LOAD_MS)
        results = page.locator("#insp-search-results")
        results.locator("mark").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        assert "1 match" in page.locator("#insp-search-message").inner_text()
        results.get_by_text(target, exact=True).filter(visible=True).first.click()
        summary = page.locator("#insp-summary")
        summary.get_by_text(target).first.wait_for(timeout=LOAD_MS)
        page.locator("#insp-chat").get_by_text(PHRASE).first.wait_for(timeout=LOAD_MS)
        shot(page, "search")
