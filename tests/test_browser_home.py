"""The studio's landing page in a real browser (headless Debian chromium)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser import chromium_page, studio_server

pytestmark = pytest.mark.browser
SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"


def test_home_page_renders(tmp_path):
    with studio_server(tmp_path) as url, chromium_page() as page:
        page.goto(url)
        page.get_by_text("EnvACE Studio").first.wait_for(timeout=30_000)
        assert page.get_by_text("smollm2-135m").first.is_visible()
        SHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(tmp_path / "home.png"), full_page=True)
