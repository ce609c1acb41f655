"""The field vocabulary's old home: ``alias``, ``Range``, ``field_table`` and ``check_ranges``
live in ``runtime.config`` with the parsing that reads them; the configs import them here."""

from proxrl.runtime.config import (
    FREE_ON_RESUME,
    SESSION_OPTION,
    Range,
    alias,
    check_ranges,
    field_table,
    optional_inner,
)

__all__ = (
    "FREE_ON_RESUME",
    "SESSION_OPTION",
    "Range",
    "alias",
    "check_ranges",
    "field_table",
    "optional_inner",
)
