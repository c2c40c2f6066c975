"""τ²-bench airline, retail and mock as suites (``suite``): our own tools from the behavioural
spec (``airline``, ``retail``, ``mock`` and their tool tables), the environment and its state hash
(``env``), τ²'s evaluation (``scoring``), what the simulated user is told (``user_prompt``) and
the data files under ``data/`` with their loaders (``dataset``). The data is MIT-licensed (Sierra
Research): ``data/SOURCE.md`` and ``data/LICENSE`` go with every copy.
"""
