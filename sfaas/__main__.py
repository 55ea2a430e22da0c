"""``python -m sfaas`` is the ``sfaas`` command."""

from launcher import main

raise SystemExit(main())
