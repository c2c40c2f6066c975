"""The example MCP suite: an inventory server (``server``), ``suite.toml`` and ``tasks.jsonl``."""
