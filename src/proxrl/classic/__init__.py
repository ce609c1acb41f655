"""Classic PPO and TRPO on gymnasium environments, checked against the PPO paper.

Imports its math from ``proxrl.core`` and its plumbing from ``proxrl.runtime`` only (no
transformers). Entry points: ``proxrl classic`` (``proxrl.classic.train``) and
``proxrl classic-eval`` (``proxrl.classic.evaluate``).
"""
