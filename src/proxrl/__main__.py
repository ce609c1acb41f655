"""``python -m proxrl`` is the ``proxrl`` command."""

from proxrl.cli import main

raise SystemExit(main())
