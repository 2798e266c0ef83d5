"""``python -m bookie`` is the ``bookie`` console script."""

from bookie.cli import main

raise SystemExit(main())
