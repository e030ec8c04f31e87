"""``python -m kvoracle`` runs the ``kvoracle`` command."""

from kvoracle.conformance.cli import main

raise SystemExit(main())
