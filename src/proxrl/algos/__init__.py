"""One file per algorithm: a config dataclass and ``train(cfg)`` in numbered steps."""
