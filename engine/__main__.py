"""``python -m engine`` -- see :mod:`engine.cli.main`."""

from engine.cli.main import main

raise SystemExit(main())
