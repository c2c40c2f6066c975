"""The embedded Hugging Face engine: ``sampler.HFSampler`` and what makes it fast on a CPU.

``session`` (continuous batching), ``kv`` (prefix cache and K/V slabs), ``cascade`` (attention
over a shared prefix plus per-row columns), ``packed`` (oneDNN-packed linear weights), ``heap``
(allocator settings), ``sampling`` (temperature/top-k/top-p draws with log-probs).
"""
