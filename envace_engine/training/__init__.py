"""Training: role-wise GRPO (``trainer``) and the SFT warm-up (``sft``).

The math is pure and small (``advantages``, ``loss``); ``batching`` packs rows into
micro-batches, ``metrics`` names what a step reports, ``checkpoint`` saves and restores a run.
``parallel`` holds the infrastructure for more than one process (torch.distributed, FSDP2, weight
sync to SGLang servers). May import: the foundation modules, ``environments``, ``samplers``,
``rollout`` and ``fidelity`` (docs/architecture.md).
"""
