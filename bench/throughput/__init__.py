"""Pieces of ``bench/rollout_throughput.py``: one engine run in a child process (``child``),
transformers' continuous batching behind our ``Session`` protocol (``library``), a git
revision's engine (``revision``) and the machine's own GEMM and memory limits (``roofline``)."""
