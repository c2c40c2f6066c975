"""Experiments built on the engine's public API: each a package with its README (what it tests and
the result it expects, in one line), its runner and its report. The engine never imports them;
a recipe adds its commands to ``envace`` through the ``envace.commands`` entry point."""
