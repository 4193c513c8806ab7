"""The subcommands that are not a technique of the registry, one module each: ``register(sub)`` adds its
parser, ``run(args, ctx) -> int`` runs it (``ctx``: :class:`engine.cli.context.Context`).  The
techniques' subcommands come from :mod:`engine.registry`."""

#: in ``--help`` order: these first, then the registry's techniques, then AFTER
BEFORE = ("info", "prompts", "accuracy")
AFTER = ("evaluate", "finetune", "report", "reproduce", "pins")
