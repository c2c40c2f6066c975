"""The studio's landing page in a real browser (headless Debian chromium)."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, open_page, shot
from tests.studio_data import make_run

pytestmark = pytest.mark.browser


def test_home_page_renders(tmp_path):
    make_run(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=home")  # the Study page comes first
        page.get_by_text("smollm2-135m").first.wait_for(state="visible", timeout=LOAD_MS)
        page.get_by_text("1 run(s), 8 episode(s)").wait_for(timeout=30_000)
        shot(page, "home")
