"""Session-wide hooks: timings reported by tests are printed in pytest's terminal summary."""

from __future__ import annotations

TIMINGS: list[str] = []


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if TIMINGS:
        terminalreporter.section("timings reported by tests")
        for line in TIMINGS:
            terminalreporter.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    # close the cache's process-wide DuckDB instance before interpreter teardown
    import gc

    from cache.connection import reset_engine
    reset_engine()
    gc.collect()
