"""The trackio dashboard of a real (tiny) training run that reported to it, in a browser."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.browser import chromium_page, free_port
from tests.studio_browser import shot
from tests.test_tracking import train_reporting

pytestmark = pytest.mark.browser


@contextlib.contextmanager
def _dashboard(trackio_dir: Path, port: int):
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir), "GRADIO_SERVER_PORT": str(port)}
    trackio = Path(sys.executable).parent / "trackio"
    proc = subprocess.Popen(
        [str(trackio), "show", "--project", "envace"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "trackio show did not start"
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_the_dashboard_shows_the_runs_curves(tmp_path):
    folder = train_reporting(tmp_path, "tiny-tracked", "--set", "steps=4")
    with _dashboard(folder, free_port()) as url, chromium_page() as page:
        page.goto(f"{url}/?project=envace")
        page.get_by_text("tiny-tracked").first.wait_for(timeout=60_000)
        page.get_by_text("loss").first.wait_for(timeout=60_000)
        time.sleep(2)  # let the plots draw
        shot(page, "trackio")
