"""Runtime services shared by every trainer: configs and CLI parsing, metrics, checkpoints,
output directories, seeding. Nothing here knows about a particular algorithm."""

from proxrl.runtime.errors import ProxrlError

__all__ = ["ProxrlError"]
