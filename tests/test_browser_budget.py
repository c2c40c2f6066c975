"""Rehearsal budget in a real browser: a sweep's chart, per-task table and Δ vs N = 0, a bad
sweep form, and saving the chosen budget."""

from __future__ import annotations

import json

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, fill, open_page, shot
from tests.studio_data import make_sweep

pytestmark = pytest.mark.browser


def test_sweep_chart_and_saved_budget(tmp_path):
    make_sweep(tmp_path)
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=budget")
        fill(page, "bud-budgets", "0,lots")
        page.locator("#bud-run").click()
        page.locator("#bud-message").get_by_text("budgets: must be whole numbers").wait_for(
            timeout=LOAD_MS
        )
        choose(page, "bud-pick", "sweep-demo")
        page.locator("#bud-chart .vega-embed").first.wait_for(timeout=LOAD_MS)
        page.get_by_text("parallel N=2").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        # the paired Δ vs N = 0: +1/3 for both modes (tests/test_studio_pages.py has the CI)
        deltas = page.locator("#bud-deltas")
        deltas.scroll_into_view_if_needed()  # the table renders rows only once in view
        deltas.get_by_text("0.333").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        page.locator("#bud-save").click()
        page.get_by_text("Saved budget N=2 (parallel)").wait_for(timeout=LOAD_MS)
        shot(page, "budget")


@pytest.mark.slow
def test_tiny_sweep_job_draws_its_chart(tmp_path, monkeypatch):
    """A real `envace sweep` on the tiny model (1 task, N in 0,1): minutes on a busy CPU."""
    monkeypatch.setenv("ENVACE_DEMO", "0")
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url, "?tab=budget")
        choose(page, "bud-model", "tiny")
        for elem_id, value in (
            ("bud-tasks", "1"),
            ("bud-budgets", "0,1"),
            ("bud-turns", "1"),
            ("bud-tokens", "12"),
        ):
            fill(page, elem_id, value)
        page.locator("#bud-modes").get_by_text("sequential", exact=True).click()  # untick
        page.locator("#bud-check").get_by_text("schema check").click()  # tick
        page.locator("#bud-run").click()
        page.locator("#bud-message").get_by_text("Launched").wait_for(timeout=LOAD_MS)
        page.locator("#bud-progress").get_by_text("— done:").wait_for(timeout=600_000)
        page.get_by_text("parallel N=1").filter(visible=True).first.wait_for(timeout=LOAD_MS)
        page.locator("#bud-chart .vega-embed").first.wait_for(timeout=LOAD_MS)
        shot(page, "budget-sweep")
    (manifest,) = [p for p in tmp_path.glob("runs/*/run.json") if "sweep" in p.read_text()]
    assert json.loads(manifest.read_text())["config"]["check_calls"] is True
