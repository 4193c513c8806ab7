"""Copy as code: a page's view as the CLI command and the notebook lines that reproduce its numbers.

``set_flags`` / ``set_python`` write a prompt set (``PromptSetSpec``) as ``python -m engine`` flags and as the
constructor call the notebook API takes (only the fields that differ from the defaults); each page's function
below writes its own view.  A test runs each snippet and compares its output with the page's numbers.
"""

from __future__ import annotations

import shlex
from dataclasses import fields

from engine.prompts.promptsets import PromptSetSpec


def set_flags(spec: PromptSetSpec) -> list[str]:
    """The CLI's prompt-set flags for ``spec`` (a written template: ``--template`` with its operation)."""
    out = ["--op", ",".join(spec.ops), "--n", str(spec.n), "--seed", str(spec.seed)]
    if spec.templates:
        for t in spec.templates:
            out += ["--template", t.split(":", 1)[1]]
    else:
        out += ["--families", ",".join(spec.families)]
    if (spec.operand_lo, spec.operand_hi) != (1, 9):
        out += ["--operands", f"{spec.operand_lo}-{spec.operand_hi}"]
    for flag, on in (("--allow-negative", spec.allow_negative), ("--no-balance", not spec.balance),
                     ("--every", spec.every)):
        if on:
            out.append(flag)
    if spec.decimals:
        out += ["--decimals", str(spec.decimals)]
    if spec.counterfactual != "operator-removed":
        out += ["--counterfactual", spec.counterfactual]
    if spec.digit != "first":
        out += ["--digit", spec.digit]
    return out


def set_python(spec: PromptSetSpec) -> str:
    """``PromptSetSpec(...)`` with the fields of ``spec`` that differ from the defaults."""
    base = PromptSetSpec()
    args = [f"{f.name}={getattr(spec, f.name)!r}" for f in fields(spec)
            if getattr(spec, f.name) != getattr(base, f.name)]
    return f"PromptSetSpec({', '.join(args)})"


def path_patching_code(model_spec: str, spec: PromptSetSpec, metric: str, k: int) -> tuple[str, str]:
    """(CLI, Python) of the Path patching page's heatmap and its key heads (all operations' pairs)."""
    cli = shlex.join(["python", "-m", "engine", "path-patching", "--model", model_spec, *set_flags(spec),
                      "--out", "effects.csv"])
    py = (f"from engine import PromptSetSpec, ResultCache, cached_path_patching, kept_pairs, open_model\n\n"
          f"model = open_model({model_spec!r})\n"
          f"cache = ResultCache()                                  # the dashboard's results\n"
          f"pairs, _ = kept_pairs(model, {set_python(spec)}, cache=cache)\n"
          f"table, _ = cached_path_patching(model, pairs, cache=cache)\n"
          f"print(table.top_heads({k}, {metric!r}))                 # the page's key heads: (layer, head, value)\n")
    return cli, py
