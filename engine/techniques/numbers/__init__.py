"""Number representations: how the residual stream holds A, B and the answer C, layer by layer.

The paper stops at "heads move the operands to END, MLPs write the answer".  Later work reads the
numbers themselves: linear probes of operands and result (Stolfo et al., 2023; Nikankin et al., 2025),
Fourier features of number tokens (Zhou et al., 2024: periods 2, 5, 10) and a generalized helix
(Kantamneni & Tegmark, 2025: cos/sin at periods 2, 5, 10, 100 plus a linear part).

What is computed, exactly (``P`` prompt pairs, reference prompts only), one module per part, each opening with
its part of the method:

* :mod:`.activations` -- the residual stream of every layer at END, A and B: one forward pass per prompt set,
  remembered (:func:`.activations.remembered`) with the prompts' keys and values before END for the shifts;
* :mod:`.probes` -- 1. held-out probes of A, B, C (logistic, ridge, n mod T, circular digit probes) and the rows
  of every layer, position and target (the probes' and the helix fits');
* :mod:`.fourier` -- 2. the DFT of the number tokens' embeddings and unembeddings, and of the numbers' frequency
  in text (the control);
* :mod:`.helix` -- 3. the helix, linear, class-means and PCA fits, and the helix circle of one layer;
* :mod:`.shifts` -- a vector added to the residual stream at one position, the answer read out (the causal
  check's and helix patching's);
* :mod:`.causal` -- 4. the causal check: the END residual moved along a class-mean direction;
* :mod:`.directions` -- 5. one number's class-mean direction (what Intervene adds);
* :mod:`.command` -- ``python -m engine numbers`` and the circuit summary's sentence.

``METHOD`` and ``VERSION`` (in :mod:`.activations`) are part of every cache key of every part.  The package
re-exports what other modules, pages and tests use (``from engine.techniques.numbers import ...``).
"""

from __future__ import annotations

from engine.techniques.numbers.activations import (
    METHOD,
    POSITIONS,
    TARGETS,
    VERSION,
    all_layers,
    check_layers,
    forget_residuals,
    layer_residuals,
    positions,
    resid_hook,
    residual_pass,
    residual_pass_work,
    residuals,
    residuals_and_end_logits,
    residuals_and_prefixes,
    target_values,
)
from engine.techniques.numbers.causal import (
    CausalRow,
    cached_causal_check,
    causal_check,
    causal_check_work,
    causal_layer,
    causal_plan,
    value_token,
)
from engine.techniques.numbers.command import cli, finding
from engine.techniques.numbers.fourier import (
    FREQUENCY_SPACE,
    N_DOMINANT,
    SpectrumRow,
    cached_number_spectrum,
    dominant_periods,
    number_frequencies,
    number_range,
    number_spectrum,
    number_vectors,
    spectrum,
)
from engine.techniques.numbers.helix import (
    PERIODS,
    CirclePoint,
    cached_helix_circle,
    helix_basis,
    helix_circle,
    helix_rank,
    principal_directions,
)
from engine.techniques.numbers.probes import (
    DECODE_THRESHOLD,
    FOLDS,
    LOGREG_C,
    MIN_FOLDS,
    RIDGE_ALPHA,
    NumberRow,
    cached_number_probes,
    decode_words,
    default_layer,
    first_decode_layer,
    number_probes,
    probes_cost,
)
from engine.techniques.numbers.shifts import (
    continued_readouts,
    shifted_readout,
    shifted_readouts,
    shifted_top_tokens,
    shifts_work,
)

__all__ = [  # the names other modules, pages and tests import from the package
    "METHOD", "VERSION", "POSITIONS", "TARGETS", "positions", "target_values", "all_layers", "check_layers",
    "resid_hook", "residuals", "residuals_and_end_logits", "residual_pass", "residuals_and_prefixes",
    "layer_residuals", "forget_residuals", "residual_pass_work",
    "FOLDS", "MIN_FOLDS", "LOGREG_C", "RIDGE_ALPHA", "DECODE_THRESHOLD", "NumberRow", "number_probes",
    "probes_cost", "cached_number_probes", "default_layer", "first_decode_layer", "decode_words",
    "N_DOMINANT", "number_range", "number_vectors", "SpectrumRow", "spectrum", "FREQUENCY_SPACE",
    "number_frequencies", "number_spectrum", "cached_number_spectrum", "dominant_periods",
    "PERIODS", "helix_basis", "helix_rank", "principal_directions", "CirclePoint", "helix_circle",
    "cached_helix_circle",
    "shifted_readout", "shifted_readouts", "continued_readouts", "shifted_top_tokens", "shifts_work",
    "CausalRow", "value_token", "causal_plan", "causal_check", "causal_check_work", "causal_layer",
    "cached_causal_check",
    "cli", "finding",
]
