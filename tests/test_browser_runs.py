"""Runs & jobs in a real browser: a bad form value is explained; a tiny training job is
launched from the form and followed until it is done."""

from __future__ import annotations

import pytest

from tests.browser import chromium_page, studio_server
from tests.studio_browser import LOAD_MS, choose, fill, open_page, open_tab, shot

pytestmark = [pytest.mark.browser, pytest.mark.slow]
JOB_MS = 240_000  # one EnvACE step on the tiny model: ~15 s alone, more on a busy machine


def test_bad_value_then_tiny_training_job_reaches_done(tmp_path, monkeypatch):
    monkeypatch.setenv("ENVACE_DEMO", "0")  # start empty: the only run is the one we launch
    with studio_server(tmp_path) as url, chromium_page() as page:
        open_page(page, url)
        open_tab(page, "Runs & jobs")
        choose(page, "launch-kind", "train: EnvACE training (rehearsal mode, role-wise GRPO)")
        fill(page, "launch-model", "gpt-17")
        page.locator("#launch-button").click()
        message = page.locator("#launch-message")
        message.get_by_text("model: unknown model 'gpt-17'").wait_for(timeout=LOAD_MS)
        shot(page, "runs-error")

        choose(page, "launch-model", "tiny")
        for elem_id, value in (
            ("launch-steps", "1"),
            ("launch-tasks", "1"),
            ("launch-turns", "1"),
            ("launch-tokens", "12"),
        ):
            fill(page, elem_id, value)
        page.locator("#launch-button").click()
        message.get_by_text("Launched").wait_for(timeout=LOAD_MS)
        jobs = page.locator("#jobs-table")
        jobs.get_by_text("done", exact=True).filter(visible=True).first.wait_for(timeout=JOB_MS)
        page.locator("#run-progress").get_by_text("done").wait_for(timeout=LOAD_MS)
        runs = page.locator("#runs-table")
        assert runs.get_by_text("train", exact=True).filter(visible=True).count() == 1
        shot(page, "runs")
