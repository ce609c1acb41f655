"""The one exception type that reaches the user as a message instead of a traceback.

Raise ``ProxrlError`` for anything the user can fix (a bad option value, a missing file, an
output directory that already holds a run). ``proxrl`` prints it as one line,
``proxrl <command>: error: <message>``, and exits with code 2; ``--debug`` shows the traceback.
Programming errors (shape mismatches, bugs) stay ordinary exceptions.
"""

from __future__ import annotations


class ProxrlError(Exception):
    """A user-facing error: printed as one line, exit code 2."""

    exit_code = 2
