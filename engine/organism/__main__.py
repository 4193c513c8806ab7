"""``python -m engine.organism train|card``: see :mod:`engine.organism.train`."""

from engine.organism.train import main

raise SystemExit(main())
