"""The tests mirror the code: every technique (a module or a package of ``engine/techniques``) has a test file named
for it, ``tests/<tier>/test_<name>.py``, so that a reader finds a method's exactness test where its name says."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TECHNIQUES = REPO / "engine" / "techniques"
#: techniques tested in another technique's file, and why (kept short on purpose: each is a debt)
ELSEWHERE = {"helix_patch": "test_numbers.py (the Numbers page's helix patching, its fixtures and SmolLM2 check)"}


def techniques() -> list[str]:
    mods = [p.stem for p in TECHNIQUES.glob("*.py") if p.stem != "__init__"]
    pkgs = [p.name for p in TECHNIQUES.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    return sorted(mods + pkgs)


def test_every_technique_has_its_test_file():
    names = techniques()
    assert len(names) >= 20
    tested = {p.stem.removeprefix("test_") for p in (REPO / "tests").glob("*/test_*.py")}
    missing = [n for n in names if n not in tested and n not in ELSEWHERE]
    assert not missing, f"no tests/<tier>/test_<name>.py for: {', '.join(missing)}"


def test_the_exceptions_are_still_needed_and_name_a_real_file():
    for name, where in ELSEWHERE.items():
        assert name in techniques() and not list((REPO / "tests").glob(f"*/test_{name}.py")), name
        assert list((REPO / "tests").glob(f"*/{where.split()[0]}")), where
