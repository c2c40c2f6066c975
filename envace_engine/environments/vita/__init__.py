"""VitaBench delivery and in-store (spec: docs/vitabench.md): our own tools, written from the
behavioural spec, over a database that each task carries.

``dataset`` parses the task files under ``data/`` (MIT, Sierra Research and Meituan:
``data/SOURCE.md`` and ``data/LICENSE`` go with every copy); ``world`` is one episode's live
state; ``generic``, ``delivery`` and ``instore`` are the tool functions, ``tools`` their table and
schemas, ``env`` the environment, ``prompts`` the fixed texts and ``task`` the engine ``Task``.
"""
