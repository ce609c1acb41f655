"""The test suite is the package ``tests``: a helper is imported by name
(``from tests.algos.lm_tasks import CORPUS``), and a reward function or environment a run loads
is named as ``tests.algos.online_rewards:target_fraction``. pytest puts the repository root on
``sys.path`` (``pythonpath`` in pyproject.toml); a subprocess gets it through PYTHONPATH
(``tests/distributed/launch.py``, ``tests/algos/killed_runs.py``), a Ray actor from the driver's
``sys.path``."""
