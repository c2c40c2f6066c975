"""Small Playwright helpers for the studio's page tests (Gradio 6 DOM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

SHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"
LOAD_MS = 60_000


def open_page(page: Any, url: str, query: str = "") -> None:
    """Load the studio (optionally with a deep-link query) and wait for the header."""
    page.goto(f"{url}/{query}")
    page.get_by_text("EnvACE Studio").first.wait_for(timeout=LOAD_MS)


def open_tab(page: Any, name: str) -> None:
    """Click a page tab by its label."""
    page.get_by_role("tab", name=name).click()


def fill(page: Any, elem_id: str, text: str) -> None:
    """Type into a Textbox or Number by elem_id (its textarea or input)."""
    box = page.locator(f"#{elem_id} textarea, #{elem_id} input").first
    box.fill(text)
    box.press("Tab")  # blur: gradio sends the new value on change/blur


def choose(page: Any, elem_id: str, option: str) -> None:
    """Pick an option of a Dropdown by its visible label."""
    page.locator(f"#{elem_id} input").first.click()
    page.get_by_role("option", name=option).first.click()


def shot(page: Any, name: str) -> Path:
    """Save a full-page screenshot under docs/screenshots/."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = SHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
