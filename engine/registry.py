"""The technique registry: every technique of the lab, declared once.

A technique is a module under ``engine/techniques/`` whose docstring states the method, with a cached
function (through the result cache), its row type, a ``cli(args, ctx) -> dict`` (the JSON the command
prints; it writes its CSV) and, when it belongs to the circuit summary, a ``finding(model, pairs,
cache, table) -> str | None`` (its sentence, from cached results only).  Its entry here says what the
rest of the lab needs:

* ``name``     -- the technique's one name: its CLI subcommand, ``python -m engine NAME`` (:mod:`engine.cli.main`
  adds one per entry), and, with ``_`` for ``-``, its module; ``aliases`` -- former command names that keep
  working;
* ``title``, ``help`` -- how the report, the docs and ``--help`` call it;
* ``module``   -- the technique's module;
* ``options``  -- its CLI arguments beyond the model and prompt-set ones;
* ``cli``      -- the module's command function (it may name another: ``"cli_curve"``, or another technique
  module's: ``"head_patching:cli_patch"``).

The registry is plain data: it imports no technique (``load`` does, on use) and knows nothing of the
dashboard -- ``ui/nav.py`` maps each name to the page that shows it.  A technique that belongs to the
paper's argument also has a step in :data:`engine.findings.steps.STEPS` (its ``finding`` sentence, its
check).  Adding a technique is its module, its chart in ``views/``, its page, its test and one entry below
(docs/architecture.md, "Adding a technique").
"""

from __future__ import annotations

import argparse
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MODULES = "engine.techniques."


def whole_number(text: str, least: int) -> int:
    """An argparse type: ``text`` as a whole number of at least ``least``."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < least:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {v}" if least == 1 else
                                         f"must be >= {least}, got {v}")
    return v


def positive_int(text: str) -> int:
    return whole_number(text, 1)


def nonneg_int(text: str) -> int:
    return whole_number(text, 0)


@dataclass(frozen=True)
class Option:
    """One CLI argument: ``parser.add_argument(*flags, **kwargs)``."""

    flags: tuple[str, ...]
    kwargs: dict[str, Any]


def opt(*flags: str, **kwargs: Any) -> Option:
    return Option(flags, kwargs)


def out(help: str, required: bool = True) -> Option:
    return Option(("--out",), {"type": Path, "required": required, "help": help})


@dataclass(frozen=True)
class Technique:
    name: str
    title: str
    help: str
    module: str                 # under engine/techniques/: the name with "_" for "-"
    options: tuple[Option, ...] = ()
    cli: str = "cli"            # the module's command function
    families: str = "paper"     # the prompt families the command defaults to
    prompts_file: bool = True   # the command also takes --prompts FILE
    aliases: tuple[str, ...] = ()  # former command names, still accepted

    def load(self):
        """The technique's module (imported on use: ``--help`` and the dashboard's start stay fast)."""
        return importlib.import_module(MODULES + self.module)

    def run(self, args: argparse.Namespace, ctx) -> dict:
        """The command: ``cli`` of the module, or ``"other_module:function"`` of another technique module."""
        mod, _, fn = self.cli.rpartition(":")
        return getattr(importlib.import_module(MODULES + mod) if mod else self.load(), fn)(args, ctx)

    def add_arguments(self, p: argparse.ArgumentParser) -> None:
        for o in self.options:
            p.add_argument(*o.flags, **o.kwargs)


TECHNIQUES: tuple[Technique, ...] = (
    Technique(
        "path-patching", "Path patching", "path patching of every head and MLP -> CSV", "path_patching",
        (out("output .csv"),
         opt("--by", choices=("all", "op", "template", "carry"), default="all",
             help="one row per sender (all) or per sender and op / template / carry (yes: the sums that carry and "
                  "differences that borrow in some column; no: those with none)"),
         opt("--with-prob", action="store_true", help="also the answer-probability metric"),
         opt("--batch-size", type=positive_int, default=32),
         opt("--receiver", default=None, metavar="LAYER.HEAD[:q|k|v]",
             help="instead of the answer logit, a head as receiver: every earlier sender's effect carried only "
                  "through that head's query (default), key or value at END, e.g. 3.1:q (head -> head)")),
        cli="head_patching:cli_patch", aliases=("patch",)),
    Technique(
        "attention", "Attention by token role", "END-row attention per token role (all heads) -> CSV",
        "attention",
        (out("output .csv"),
         opt("--text", help="instead: one prompt's END row of --layer/--head, token by token"),
         opt("--layer", type=nonneg_int), opt("--head", type=nonneg_int))),
    Technique(
        "mlp-projections", "MLP projections", "MLP in/out cosines with W_U of A, B, C per layer -> CSV",
        "mlp_projections",
        (out("output .csv"), opt("--text", help="also: this prompt's top number tokens per layer (Fig. 6c)")),
        aliases=("mlp-projection",)),
    Technique(
        "logit-lens", "Logit lens", "the answer's probability and rank at END after every layer -> CSV",
        "logit_lens", (out("output .csv, one row per group and layer"),)),
    Technique(
        "knockout", "Knockout", "accuracy before/after mean-ablating heads / MLPs -> JSON", "knockout",
        (opt("--heads", default="", help="LAYER.HEAD list, e.g. 3.1,5.0"),
         opt("--mlps", default="", help="MLP layers, e.g. 4,5"),
         opt("--text", help="also show this prompt's top-5 next tokens before/after"),
         out("also write the JSON here", required=False))),
    Technique(
        "knockout-curve", "Knockout curve (Fig. 3)", "Fig. 3: top-k (effect rank) vs k random heads -> CSV",
        "knockout_curve",
        (opt("--k-max", type=nonneg_int, default=10), opt("--draws", type=positive_int, default=10),
         out("output .csv"))),
    Technique(
        "intervene", "Intervene",
        "one prompt's top next tokens before / after patching, scaling, zeroing, mean-ablating chosen components "
        "or adding a number's direction -> JSON", "intervene",
        (opt("--text", required=True, help="the prompt, e.g. 'Q: What is 7 plus 8? A:'"),
         opt("--components", required=True, metavar="LIST",
             help="heads, MLPs, neurons or residual streams, e.g. 1.3,2.mlp,2.mlp.40,3.resid"),
         opt("--action", choices=("patch", "scale", "zero", "mean", "add"), default="patch"),
         opt("--source", default=None,
             help="patch: the prompt the values come from (default: --text's counterfactual)"),
         opt("--factor", type=float, default=0.0, help="scale: the factor (default 0)"),
         opt("--number", type=int, default=None,
             help="add: the number whose direction is added (its unembedding, or see --direction)"),
         opt("--direction", choices=("unembedding", "class-mean", "probe"), default="unembedding",
             help="add: the number's unembedding column (default), its class-mean direction at END over the "
                  "set's prompts answering it (the Numbers page's causal check), or its logistic probe's direction "
                  "(the Numbers page's probe of the answer, fitted on the set); the set flags choose the set"),
         opt("--direction-layer", type=nonneg_int, default=None, metavar="L",
             help="add with --direction class-mean or probe: the layer whose residual stream gives the direction "
                  "(default: the first component's layer)"),
         opt("--strength", type=float, default=1.0,
             help="add: the strength, in units of the component's own norm at END (default 1)"),
         opt("--positions", choices=("end", "all"), default="end", help="where to intervene (default END only)"),
         opt("--freeze", action="store_true", help="hold every other head at its value on --text (path patching)"),
         opt("--k", type=positive_int, default=5, help="top tokens shown (default 5)"),
         out("also write the JSON here", required=False)),
        prompts_file=False),
    Technique(
        "circuit", "Circuit diagram",
        "the circuit as a diagram: operand / operator tokens -> key heads -> MLPs -> the answer -> JSON", "circuit",
        (out("output .json: nodes (effects) and edges (attention shares, effects)"),
         opt("--k", type=positive_int, default=5, help="key heads (default 5)"),
         opt("--mlps", type=nonneg_int, default=3, help="MLPs (default 3)"),
         opt("--senders", action="store_true",
             help="also the head -> head edges between key heads (one path patching per key head as receiver)"),
         opt("--edges", choices=("exact", "eap", "eap-ig"), default=None,
             help="instead: the top --top edges of MIB's graph under this ranking (edge-scores' cached scores)"),
         opt("--top", type=positive_int, default=20, help="with --edges: edges drawn (default 20, at most 60)"))),
    Technique(
        "operand-grid", "Operand grid",
        "one head, MLP or neuron over every operand pair (A, B) of one template: attention on A / B, path-patching "
        "value, activation -> CSV", "operand_grid",
        (out("output .csv, one row per operand pair"),
         opt("--component", default=None, metavar="LAYER.HEAD|LAYER.mlp|LAYER.mlp.N",
             help="the component (default: the grid's strongest head), e.g. 1.3, 6.mlp, 6.mlp.120"),
         opt("--grid-template", default=None,
             help="the template id of the grid (default the set's first, e.g. add.paper.0)")),
        prompts_file=False),
    Technique(
        "heuristic-neurons", "Heuristic neurons",
        "the neurons of one MLP that react to the operation, each tagged with the heuristic (result range, result "
        "mod k, ...) that best predicts it over the operand grid, held out -> CSV", "heuristic_neurons",
        (out("output .csv, one row per neuron"),
         opt("--layer", type=nonneg_int, default=None, help="the MLP layer (default: the grid's strongest MLP)"),
         opt("--top", type=positive_int, default=20, help="how many neurons (default 20)"),
         opt("--grid-template", default=None,
             help="the template id of the grid (default the set's first, e.g. add.paper.0)")),
        prompts_file=False),
    Technique(
        "carries", "What each key head carries",
        "the key heads' path patching under each counterfactual kind (operator removed or swapped, operand A or B)"
        " -> CSV",
        "carries",
        (out("output .csv, one row per key head and counterfactual kind"),
         opt("--k", type=positive_int, default=5, help="how many key heads (default 5)")),
        prompts_file=False),
    Technique(
        "stability", "Stability of the key heads",
        "how often each head is in the top-k across resampled pairs, per operation / template / carry -> CSV",
        "stability",
        (out("output .csv, one row per group and head"),
         opt("--k", type=positive_int, default=5, help="the top-k list whose stability is measured (default 5)"))),
    Technique(
        "faithfulness", "Circuit faithfulness (MIB)",
        "faithfulness curves, CPR and CMD of the exact, AtP and random rankings' circuits -> CSV", "faithfulness",
        (out("output .csv, one row per ranking, metric and circuit size"),
         opt("--draws", type=positive_int, default=5,
             help="random orders of the random ranking, pair i under order i mod this (default 5)"),
         opt("--ablation", choices=("counterfactual", "mean"), default="counterfactual",
             help="what a component outside the circuit takes: its value on the pair's own X_c (default, MIB's "
                  "patching) or its mean over X_c (the knockouts' mean ablation)"),
         opt("--mib-dir", type=Path, default=None,
             help="also write the exact ranking's importance scores in MIB's submission format here, one folder "
                  "per task (arithmetic-addition / -subtraction) and model"))),
    Technique(
        "edge-scores", "Edge scores (MIB's graph)",
        "every edge of MIB's residual graph ranked by exact edge patching, EAP or EAP-IG -> CSV (and MIB files)",
        "edge_scores",
        (out("output .csv, one row per edge, one column per ranking"),
         opt("--ranking", choices=("exact", "eap", "eap-ig", "all"), default="eap",
             help="exact edge patching (about two passes of the set per edge), EAP (one gradient) or EAP-IG "
                  "(--steps gradients); default eap"),
         opt("--steps", type=positive_int, default=5, help="EAP-IG's points between X_c and X_r (default 5)"),
         opt("--mib-dir", type=Path, default=None,
             help="also write each ranking's edge scores in MIB's submission format here, one folder per task "
                  "(arithmetic-addition / -subtraction) and model, node scores kept"),
         opt("--mib-sizes", default=None, metavar="X,Y",
             help="with --mib-dir, also a circuit file per share of the edges kept (top |score|), e.g. 0.01,0.05"),
         opt("--faithfulness", type=Path, default=None, metavar="CSV",
             help="also each ranking's faithfulness curve here: circuits of its top edges, every other edge "
                  "ablated as MIB does (one row per ranking, size and metric; CPR / CMD in the summary)"),
         opt("--ablation", choices=("counterfactual", "mean"), default="counterfactual",
             help="with --faithfulness, what an edge outside the circuit sends: its sender's value on the pair's "
                  "own X_c (default, MIB's patching) or its mean over X_c (per template, END-aligned)"),
         opt("--resolution", choices=("edge", "edge-position", "node-position"), default="edge",
             help="what the scores (--out: one row per unit) and the circuits (--faithfulness) are of: edges "
                  "(default), edges at token roles (operand A, operator, operand B, END, other) or heads and MLPs "
                  "at token roles; at a position resolution exact patches each unit alone (an edge at a role: five "
                  "times exact edge patching), eap / eap-ig are split by role"))),
    Technique(
        "transfer", "Transfer (Table 4)", "Table 4: key-head overlap and cross knockouts of two sets -> JSON",
        "transfer",
        (opt("--b-families", default="word", help="families of the second set (default word)"),
         opt("--b-bench", choices=("svamp", "gsm8k", "addsub", "singleeq"),
             help="second set from a math benchmark instead (needs --data-dir)"),
         opt("--data-dir", type=Path, default=Path("../shared/data")),
         opt("--k", type=positive_int, default=10), out("also write the JSON here", required=False)),
        prompts_file=False),
    Technique(
        "position-patching", "Position patching",
        "layer x position activation patching of the residual stream -> CSV", "position_patching",
        (out("output .csv, one row per group, layer and position"),
         opt("--group", default=None, help="only this group: '*', op:add, template:<id> (default: every group)")),
        aliases=("position-patch",)),
    Technique(
        "attribution", "Attribution patching (AtP)",
        "attribution patching (AtP) beside exact path / activation patching -> CSV", "attribution",
        (out("output .csv, one row per sender"), opt("--metric", choices=("effect", "logit_diff"), default="effect"),
         opt("--no-total", action="store_true",
             help="skip the activation-patching pair (exact_total, atp_total): one forward per sender"))),
    Technique(
        "numbers", "Numbers", "probes, Fourier spectrum, helix fit and causal check of A, B, C per layer -> CSV",
        "numbers",
        (out("output .csv, one row per layer, position, target and method"),
         opt("--layers", default=None, help="layers, -1 = embedding, e.g. --layers=-1,0,5 (default: all)"),
         opt("--spectrum-out", type=Path, default=None, help="also write the number tokens' DFT rows here"),
         opt("--no-causal", action="store_true", help="skip the causal check (its forward passes)"))),
    Technique(
        "helix-patch", "Helix-subspace patching",
        "one token's residual moved to a donor's number in full, along the fitted helix, or in PCA / random "
        "subspaces of its dimension: how often the answer follows -> CSV", "helix_patch",
        (out("output .csv, one row per patch"),
         opt("--layer", type=int, default=None, help="the layer whose output is patched, -1 = the embedding, "
             "e.g. --layer=-1 (default: where C first decodes at END, else the last layer: the number probes)"),
         opt("--position", choices=("END", "A", "B"), default="END", help="the token patched (default END)"),
         opt("--target", choices=("A", "B", "C"), default="C", help="the number moved (default C)"))),
)


def technique(name: str) -> Technique:
    """The entry called ``name``; KeyError with the registered names otherwise."""
    for t in TECHNIQUES:
        if t.name == name:
            return t
    raise KeyError(f"no technique {name!r}: registered are {', '.join(t.name for t in TECHNIQUES)}")
