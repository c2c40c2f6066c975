"""What every page's handlers share: the data folder, the store, the job manager, the policy."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from storage import Store
from studio import demo
from studio.auth import AuthPolicy
from studio.jobs import JobManager
from studio.space import HostLimits

if TYPE_CHECKING:
    from storage import Store


@dataclass(frozen=True)
class Studio:
    """One studio process's services, built once by ``studio.app.build_app``."""

    root: Path
    store: Store
    jobs: JobManager
    policy: AuthPolicy
    limits: HostLimits = field(default_factory=HostLimits)

    @classmethod
    def open(
        cls, root: Path, policy: AuthPolicy | None = None, limits: HostLimits | None = None
    ) -> Studio:
        """Open (or create) the studio data folder ``root`` (``limits``: a Space's job caps)."""

        root.mkdir(parents=True, exist_ok=True)
        if os.environ.get("ENVACE_DEMO", "1") != "0":  # ENVACE_DEMO=0: start empty
            demo.install(root)
        store = Store(root)
        limits = limits or HostLimits()
        return cls(
            root=root,
            store=store,
            jobs=JobManager(root, store, max_active=limits.max_jobs),
            policy=policy or AuthPolicy(),
            limits=limits,
        )
