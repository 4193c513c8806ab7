"""Every fast path checks itself (engine/machinery/shortcut.py): a static test over the engine's source.

A *fast path* computes the model's logits from something other than a whole forward pass -- a cached residual
stream read through the final norm and the unembedding (``answer_logits(``, ``final_logits(``), an END chain of
:mod:`engine.machinery.end_chain`, or a prompt continued from the model's own keys and values
(``continue_end_logits(``, ``past_key_values``).  Such a module must check its result against the model's own
answer logit (``check_reproduces``) and give way to its textbook loop on a :class:`ShortcutMismatch`; a module
that only prepares what another module checks names that module in :data:`CHECKED_ELSEWHERE`.  A new fast path
with no check fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: where fast paths live (the backends define the primitives; they compute nothing on their own)
SCANNED = ("engine/techniques", "engine/machinery")
FAST_PATH = re.compile(r"\banswer_logits\(|\bfinal_logits\(|\bend_chain\.|\bcontinue_end_logits\(|\bpast_key_values\b")
CHECK = re.compile(r"\bcheck_reproduces\b|\bShortcutMismatch\b")
#: module -> the module that checks what it computes (and why it may not check it itself)
CHECKED_ELSEWHERE = {
    # the residual pass keeps each prompt's unshifted continuation; the shifts compare it with the model's END logits
    "engine/techniques/numbers/activations.py": "engine/techniques/numbers/shifts.py",
}


def _sources() -> dict[str, str]:
    return {str(p.relative_to(ROOT)): p.read_text() for d in SCANNED for p in sorted((ROOT / d).rglob("*.py"))}


def fast_paths_without_a_check(sources: dict[str, str]) -> list[str]:
    """The modules of ``sources`` (path -> text) that compute logits on a fast path and never check them."""
    out = []
    for path, text in sources.items():
        if path.endswith("machinery/shortcut.py") or not FAST_PATH.search(text) or CHECK.search(text):
            continue
        checker = CHECKED_ELSEWHERE.get(path)
        if checker is None or not CHECK.search(sources.get(checker, "")):
            out.append(path)
    return out


def test_every_fast_path_checks_itself():
    missing = fast_paths_without_a_check(_sources())
    assert not missing, (f"{missing}: a fast path with no self-check -- compare its unpatched result with the model's "
                         f"answer logit (engine.machinery.shortcut.check_reproduces) and fall back to the textbook "
                         f"loop on ShortcutMismatch, saying so (fallback_note)")


def test_the_scan_finds_the_known_fast_paths():
    """The pattern is not vacuous: the fast paths the lab has are found, and a copy of one without its check fails."""
    sources = _sources()
    found = {p for p, t in sources.items() if FAST_PATH.search(t)}
    for path in ("engine/techniques/path_patching.py", "engine/techniques/attribution.py",
                 "engine/techniques/logit_lens.py", "engine/techniques/operand_grid.py",
                 "engine/machinery/patch_rows.py"):
        assert path in found, path
    unchecked = CHECK.sub("nothing", sources["engine/techniques/logit_lens.py"])
    assert fast_paths_without_a_check({"engine/techniques/x.py": unchecked}) == ["engine/techniques/x.py"]
    assert fast_paths_without_a_check({**sources, "engine/techniques/numbers/shifts.py": ""}) == \
        ["engine/techniques/numbers/activations.py"]
    for path, checker in CHECKED_ELSEWHERE.items():
        assert path in found and CHECK.search(sources[checker]), (path, checker)
