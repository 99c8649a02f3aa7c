"""``python -m durablesched`` is the ``durablesched`` command."""

from .cli.main import main

raise SystemExit(main())
