"""Test time: private rehearsal (``rehearsal``), the rehearsal memory (``memory``), the
``select`` mode (``select``), and real-environment evaluation, pass^k and budget sweeps
(``evaluate``).

May import: the foundation modules, ``environments``, ``samplers``, ``rollout`` and ``fidelity``;
never ``training`` (docs/architecture.md).
"""
