"""The episode loop and everything it renders, parses and tokenises.

``loop`` runs batches of episodes (act, rehearse, real or simulated tool answers); ``prompts``
renders both roles' chats; ``parsing`` turns model text into calls or structured errors;
``tokens`` keeps the token-in/token-out sequences; ``rewards`` scores finished episodes. May
import: the foundation modules, ``environments`` and ``samplers`` (docs/architecture.md).
"""
