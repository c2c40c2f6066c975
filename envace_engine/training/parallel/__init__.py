"""Multi-process training infrastructure: ranks (``distributed``), sharded training state
(``fsdp``) and pushing each step's weights to out-of-process samplers (``weight_sync``)."""
