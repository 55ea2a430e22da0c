"""``python -m sfaas`` is the ``sfaas`` command."""

from .cli import main

raise SystemExit(main())
