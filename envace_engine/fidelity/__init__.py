"""Rehearsed-vs-real fidelity: how close the world role's answer is to the real tool's.

``metrics`` holds the pure comparison (exact, status, key and value agreement, text similarity,
the real response's NLL under the policy); ``worker`` is the helper process storage uses to
compute text similarities beside the writer. May import only the foundation modules.
"""
