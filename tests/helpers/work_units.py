"""`make test`'s units of work under pytest-xdist: a test file is one unit (its module fixtures -- an opened model, a
module's result cache -- serve all its tests on one worker), but for the test functions in ``SPLIT``, whose cases are
dealt round-robin into that many units so that both workers share them (the architecture matrix).

xdist's ``--dist loadgroup`` was meant to do this from ``xdist_group`` marks, but xdist 3.8 names a test's group by
rewriting ``item._nodeid``, which pytest 9 no longer reads (a node's id is ``item._id``): every test was its own unit,
a file's tests went to both workers, and each worker set up the file's module fixtures -- ``test_exports.py`` opened
Gemma 3 and computed its reports on both.  This scheduler derives the unit from the test's id alone, in the
controller (which sees ids, not marks); tests/conftest.py returns it from ``pytest_xdist_make_scheduler`` when the run
asks for ``--dist loadfile``.
"""

from __future__ import annotations

from xdist.scheduler import LoadScopeScheduling

#: test functions (``path::name`` of the id) whose cases are dealt into this many units
SPLIT = {"tests/integration/test_architectures.py::test_exact_or_refused_in_one_line": 4}


class FileUnits(LoadScopeScheduling):
    """xdist's scope scheduling with a file per unit, but the functions of ``split`` dealt into several."""

    def __init__(self, config, log=None, split: dict[str, int] = SPLIT) -> None:
        super().__init__(config, log)
        self.split = split
        self.units: dict[str, str] = {}     # test id -> its unit (memo: asked again when each test completes)
        self.dealt: dict[str, int] = {}     # split function -> cases dealt so far

    def _split_scope(self, nodeid: str) -> str:
        if nodeid not in self.units:
            self.units[nodeid] = unit_of(nodeid, self.split, self.dealt)
        return self.units[nodeid]


def unit_of(nodeid: str, split: dict[str, int], dealt: dict[str, int]) -> str:
    """The unit of the test ``nodeid`` (asked once per test, in collection order): its file, or for a case of a
    function in ``split`` the next of its ``split[function]`` units in turn (``dealt`` counts the cases so far)."""
    path, _, rest = nodeid.partition("::")
    function = f"{path}::{rest.split('[', 1)[0]}"
    if function not in split:
        return path
    i = dealt.get(function, 0)
    dealt[function] = i + 1
    return f"{function}#{i % split[function]}"
