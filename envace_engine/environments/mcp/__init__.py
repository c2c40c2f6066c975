"""MCP servers as environments: the ``mcp:PATH`` suites (docs/mcp.md).

``client`` holds one SDK session on a private event loop thread, ``spec`` the suite-file and
task-file formats, ``suite`` the per-episode environment and the suite; ``example/`` a small
inventory server with its suite and tasks. Imported only when an ``mcp:`` suite is asked for.
"""
