"""The findings: the paper's argument, told once, above the techniques.

:mod:`engine.findings.steps` is the one table of the argument -- one :class:`~engine.findings.steps.Step`
per finding (its figure, the paper's number, the technique that shows it, its circuit-summary sentence and
its check).  The readers of that table live here too: the circuit summary (:mod:`.summary`, the
sentences from cached results), the paper's verdicts (:mod:`.paper`) and the HTML report's data
(:mod:`.report`); the dashboard's Paper and Story pages read the same table through ``ui/``.
"""
