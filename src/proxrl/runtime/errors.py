"""The exceptions that reach the user as a message instead of a traceback.

Raise ``ProxrlError`` for anything the user can fix (a bad option value, a missing file, an
output directory that already holds a run). ``proxrl`` prints it as one line,
``proxrl <command>: error: <message>``, and exits with code 2; ``--debug`` shows the traceback.
Programming errors (shape mismatches, bugs) stay ordinary exceptions.

``RunFinished``: ``--resume`` of a run that already took all its steps; ``proxrl`` prints
``proxrl <command>: <message>`` on stdout and exits 0 (nothing was left to do).

``Interrupted`` is how a trainer that caught SIGINT/SIGTERM (``runtime.signals``) and saved a
checkpoint leaves: ``proxrl <command>: stopped: <message>``, exit code 128 + the signal number
(130 for SIGINT, 143 for SIGTERM), as a shell reports a process the signal killed.
"""

from __future__ import annotations


class ProxrlError(Exception):
    """A user-facing error: printed as one line, exit code 2."""

    exit_code = 2


class Interrupted(ProxrlError):
    """A run stopped on a signal after saving a checkpoint; exit code 128 + signal number."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum
        self.exit_code = 128 + signum


class RunFinished(ProxrlError):
    """``--resume`` of a run that is already complete: nothing to do, exit code 0."""

    exit_code = 0
