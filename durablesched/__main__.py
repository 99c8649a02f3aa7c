"""``python -m durablesched`` is the ``durablesched`` command."""

from .cli import main

raise SystemExit(main())
