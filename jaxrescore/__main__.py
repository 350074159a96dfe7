"""``python -m jaxrescore`` runs the ``jaxrescore`` command."""

from jaxrescore.cli import main

raise SystemExit(main())
