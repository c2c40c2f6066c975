"""Helpers for real-browser tests: start the studio as a subprocess, drive Debian chromium.

Never runs ``playwright install``: Playwright is pointed at /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def studio_server(
    root: Path,
    extra_args: tuple[str, ...] = (),
    timeout_s: float = 90,
    *,
    app_file: bool = False,
) -> Iterator[str]:
    """Run the studio on a free port with ``root`` as its data folder; yield its URL.

    ``python -m studio`` by default; ``app_file=True`` runs ``python app.py`` from the repository
    root the way the Space's image does (port from ``$PORT``).
    """
    port = free_port()
    env = dict(os.environ, ENVACE_HOME=str(root), GRADIO_ANALYTICS_ENABLED="False")
    if app_file:
        command = [sys.executable, str(Path(__file__).parents[1] / "app.py")]
        env.update(PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1")
    else:
        command = [sys.executable, "-m", "studio", "--host", "127.0.0.1", "--port", str(port)]
    log = open(root / "studio.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([*command, *extra_args], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"studio exited: {(root / 'studio.log').read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise TimeoutError(f"studio did not answer on {url} in {timeout_s} s")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@contextlib.contextmanager
def chromium_page() -> Iterator[Page]:
    """A Playwright page in headless Debian chromium."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            yield page
        finally:
            browser.close()
