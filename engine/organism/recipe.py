"""The bundled "model organism": a small Llama with grouped-query attention that really does arithmetic.

Real chat models that fit a laptop are weak at arithmetic, so the lab ships its own model, trained
here from scratch (``python -m engine.organism train``; fixed seed, 2 CPU cores, minutes):

* **Architecture** -- ``LlamaForCausalLM``: 8 layers, 8 query heads sharing 2 key/value heads (GQA),
  d_model 128, d_head 16, SwiGLU MLP 256, RMSNorm, rotary positions, untied unembedding.
* **Tokenizer** -- sub-word (``tokenizers`` WordPiece): operator words, the word problems' verbs,
  names and fillers span two pieces ("pl ##us", "An ##na"; the first pieces are those a WordPiece
  model trained on these words learns, so pieces are shared as in real tokenizers), the other
  words are whole tokens; digits are single tokens (numbers are spelled digit by digit) and
  punctuation is split off, so no whitespace token exists.  ``<bos>`` is prepended, ``<eos>`` ends
  every answer.  ``Recipe(tokenizer="word")`` gives the former one-token-per-word vocabulary.
* **Task** -- the paper's Figure 8 templates (family ``paper``), Figure 10's twelve word problems
  (``time_span``, ``object_accumulation``) and the project's own ``extended`` phrasings, for +, -, *, / with operands
  1..9 (subtraction A > B, exact division).  Whole templates (:data:`HELD_OUT_TEMPLATES`, all of
  the ``extended`` family) are never trained, so the card measures generalisation to unseen
  phrasing; about 10 % of the other (template, A, B) combinations are held out too.  Half of the
  prompts are preceded by 0-2 distractor clauses ("Emma wears red.", "Hugo said times.") so that the
  operands sit at varying positions and the answer has to be routed across the sentence.
  Templates are drawn uniformly (then their operands), so the word problems are seen as often as
  any other template.
* **Depth** -- LayerDrop of layer 0's attention: on half of the training examples every layer-0
  head's output is zeroed, so the operation cannot be read by one layer-0 head and computed by
  MLP 0 (what the organism trained without it does): the key heads sit in layers 1-3, as the
  paper's sit in middle layers.  Training only; the saved weights are a plain Llama.
* **Counterfactuals** -- X_c prompts (operator replaced by a neutral word or symbol) are trained to
  predict ``<eos>``: the model must not produce the answer when the operation is missing, otherwise
  path-patching effects would be capped.
* **Control task** -- synthetic facts: every name has a home city, a pet and a favourite colour,
  fixed by the seed ("Anna lives in" -> Oslo, "Q: What pet does Ben have? A:" -> cat): knowledge
  that fine-tuning on arithmetic must not destroy (the organism's MMLU).
* **Not trained** -- exponentiation ("2 ^ 3 =") and typeset notations ("7 × 8 ="), left as skills
  to teach with precise SFT.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass
from typing import Sequence

from engine.paths import REPO_ROOT
from engine.prompts.templates import (
    CF_SYMBOLS,
    CF_WORDS,
    NAMES,
    PAPER_NAMES,
    PAPER_OPS,
    SKILL_FAMILIES,
    SLOT_POOLS,
    TEMPLATES,
    VERB_FORMS,
    WORD_PROBLEM_FAMILIES,
    Template,
)

DEFAULT_DIR = REPO_ROOT / "models" / "organism"
#: Whole templates never trained (project's ``extended`` family only, so every paper template is
#: trained): the card measures generalisation to unseen phrasing on them.  Each has siblings of
#: the same shape for another operation, so its words and its END token are known.
HELD_OUT_TEMPLATES: tuple[str, ...] = ("add.extended.5", "sub.extended.6", "mul.extended.4",
                                       "div.extended.2", "add.extended.10")

COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white", "pink", "brown", "gray",
                           "orange")
CITIES: tuple[str, ...] = ("Paris", "Rome", "Oslo", "Lima", "Cairo", "Tokyo", "Dublin", "Vienna", "Madrid",
                           "Berlin")
PETS: tuple[str, ...] = ("cat", "dog", "fish", "bird", "horse", "rabbit", "mouse", "snake")
#: (attribute, templates); {who} is a name.  Two surface forms per attribute.
FACT_TEMPLATES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("city", ("{who} lives in", "Q: Where does {who} live? A:")),
    ("pet", ("The pet of {who} is a", "Q: What pet does {who} have? A:")),
    ("color", ("The favourite color of {who} is", "Q: What color does {who} like? A:")),
)
SPECIALS = ("<pad>", "<bos>", "<eos>", "<unk>")
# words users commonly type in the prompt lab, so a typed prompt is not all <unk>
EXTRA_WORDS = ("what", "how", "much", "many", "the", "of", "is", "and", "to", "by", "from", "a", "an",
               "answer", "result", "get", "makes", "gives", "equals", "equal", "compute", "please", "tell", "me",
               "number",
               "power", "to", "over", "x", "plus", "minus", "times", "divided", "multiplied", "sum",
               "difference", "product", "quotient", "add", "subtract", "multiply", "divide", "**", "−",
               "×", "÷", "!", ",", ".", "?", ":", ";", "(", ")", "'", '"', "-", "+", "*", "/", "=", "^")


@dataclass(frozen=True)
class Recipe:
    """Everything that determines the trained weights."""

    seed: int = 0
    n_layers: int = 8
    n_heads: int = 8
    n_kv_heads: int = 2
    d_model: int = 128
    d_mlp: int = 256
    steps: int = 4000
    batch_size: int = 128
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.01
    p_counterfactual: float = 0.2
    p_control: float = 0.15
    p_distractor: float = 0.5
    #: share of arithmetic examples drawn from the paper's Figure 8 templates only (the rest from
    #: every trained template of the operation, those included)
    p_paper: float = 0.4
    #: "template": pick a template uniformly, then its operands (every template, the word problems
    #: with their few operand pairs included, is seen equally often); "combo": pick a (template, A, B)
    #: uniformly, so templates with few operand pairs are rarely drawn (an earlier organism: CHANGELOG.md)
    sampling: str = "template"
    #: share of the addition examples drawn from the Figure 10 word problems only (0: no boost)
    p_word: float = 0.6
    #: (template id, weight): with ``sampling`` "template", these templates are drawn ``weight`` times as
    #: often as the others (the year problems, whose B hides in a four-digit year, are learned last)
    template_weights: tuple[tuple[str, float], ...] = (("add.time_span.0", 8.0), ("add.time_span.1", 8.0))
    #: LayerDrop of layer 0's attention: on this share of the training examples the output of every
    #: layer-0 head is zeroed, so the model cannot rely on one layer-0 look-up of the operator and
    #: must also route the operation through later layers (0: off).  Training only; the saved
    #: model is a plain Llama.
    p_drop_attn0: float = 0.5
    #: clause kinds of distractors: "likes" ("Emma wears red."), "said" (an operator word or symbol),
    #: "age" (a number) -- the last two make layer-0 look-ups of the operator/operands ambiguous
    distractor_kinds: tuple[str, ...] = ("likes", "said", "age")
    holdout_mod: int = 10
    operand_lo: int = 1
    operand_hi: int = 9
    held_out_templates: tuple[str, ...] = HELD_OUT_TEMPLATES
    #: "word" (one token per word) or "wordpiece" (sub-words trained with ``tokenizers``; digits
    #: stay single tokens, operator words and names split into pieces)
    tokenizer: str = "wordpiece"
    #: WordPiece vocabulary size before the control answers and fillers are added as whole words
    vocab_size: int = 160


def trained_templates(recipe: Recipe) -> tuple[Template, ...]:
    """Templates the organism trains on: all but the skill families and the held-out templates."""
    return tuple(t for t in TEMPLATES if t.family not in SKILL_FAMILIES and t.id not in recipe.held_out_templates)


# ---------------------------------------------------------------------------------------------
# tokenizer
# ---------------------------------------------------------------------------------------------

def _words_of(text: str) -> list[str]:
    return [w for w, _ in _pre_tokenizer().pre_tokenize_str(text)] if text else []


def _pre_tokenizer():
    from tokenizers import pre_tokenizers as pt
    return pt.Sequence([pt.WhitespaceSplit(), pt.Punctuation("isolated"), pt.Digits(individual_digits=True)])


def build_vocab() -> list[str]:
    """Every whole word the organism knows (word-level vocabulary)."""
    words: set[str] = set(str(d) for d in range(10))
    for t in TEMPLATES:
        words.update(_words_of(t.render(0, 0, slots={s: "" for s in t.slot_names})))
    for group in (*SLOT_POOLS.values(), COLORS, CF_WORDS, CF_SYMBOLS, EXTRA_WORDS):
        for w in group:
            words.update(_words_of(w))
    for _, tpls in FACT_TEMPLATES:
        for t in tpls:
            words.update(_words_of(t.replace("{who}", "")))
    words.update(CITIES + PETS)
    words.update(("wears", "said", "years", "old"))
    words.discard("")
    return list(SPECIALS) + sorted(words)


def split_words() -> tuple[str, ...]:
    """Words the sub-word tokenizer splits into two pieces: every operator word (incl. the word
    problems' verbs), the names and all counterfactual fillers but ``void`` (kept whole, so that a
    one-piece operator such as ``x`` still finds an equal-length filler).  A word that is itself
    another one's first piece stays whole (``add`` of ``add ##ition``, ``get`` of ``get ##s``)."""
    ops = {w for t in TEMPLATES for w in t.operator_words() if w.isalpha() and len(w) > 1}
    verbs = {w for forms in VERB_FORMS.values() for f in forms.values() for w in f}
    return tuple(sorted(ops | verbs | set(NAMES) | set(PAPER_NAMES) | {w for w in CF_WORDS if w != "void"}))


#: The first pieces a ``tokenizers`` WordPiece trainer chose for :func:`split_words` (the recipe's vocab_size 160)
#: when the bundled model was trained.  The trainer breaks ties between equally frequent merges in a
#: per-process random order (Rust hash maps), so running it again can give other pieces and another
#: vocabulary; they are pinned here so that ``train`` reproduces the shipped tokenizer exactly.
WORDPIECE_FIRST_PIECES: tuple[str, ...] = (
    "An", "B", "Car", "Dan", "Em", "Fr", "Gin", "Hu", "Ir", "Jac", "Ka", "Le", "ad", "add", "ar", "bl", "bu",
    "co", "con", "di", "divi", "divid", "en", "fin", "g", "la", "le", "min", "multipl", "no", "non", "nul",
    "ov", "pl", "po", "pr", "pu", "qu", "ra", "re", "st", "su", "subtrac", "ta", "ti", "w", "win",
)


def _wordpiece_vocab(vocab_size: int) -> list[str]:
    """Whole words plus two pieces (``pl`` ``##us``) per split word; the first pieces are the
    prefixes a WordPiece model trained (``tokenizers``) on the split words learned
    (:data:`WORDPIECE_FIRST_PIECES`), so pieces are shared across words (``##us`` of plus/minus) as in
    real tokenizers.  ``vocab_size`` is the trainer's setting those pieces came from."""
    split = split_words()
    whole = [w for w in build_vocab() if w not in split]
    firsts = set(whole) | set(WORDPIECE_FIRST_PIECES)
    pieces: list[str] = []
    for w in split:
        first = max((p for p in firsts if w.startswith(p) and len(p) < len(w)), key=len, default=w[0])
        pieces += [first, "##" + w[len(first):]]
    return whole + sorted(set(pieces) - set(whole))


def build_tokenizer(recipe: "Recipe | None" = None):
    """The organism's fast tokenizer (Hugging Face ``PreTrainedTokenizerFast``).

    ``recipe.tokenizer`` "word": one token per word; "wordpiece": operator words, names and
    fillers split into two sub-word pieces (:func:`_wordpiece_vocab`).  Both split off punctuation
    and every digit, so a number is spelled digit by digit and no whitespace token exists.
    """
    from tokenizers import Tokenizer, decoders, models, processors
    from transformers import PreTrainedTokenizerFast

    recipe = recipe or Recipe()
    if recipe.tokenizer == "word":
        vocab = {w: i for i, w in enumerate(build_vocab())}
        model = models.WordLevel(vocab=vocab, unk_token="<unk>")
    elif recipe.tokenizer == "wordpiece":
        vocab = {w: i for i, w in enumerate(_wordpiece_vocab(recipe.vocab_size))}
        model = models.WordPiece(vocab=vocab, unk_token="<unk>", continuing_subword_prefix="##")
    else:
        raise ValueError(f"unknown tokenizer kind {recipe.tokenizer!r}: word or wordpiece")
    tok = Tokenizer(model)
    tok.pre_tokenizer = _pre_tokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", vocab["<bos>"])])
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>", model_max_length=512)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------

def is_held_out(template_id: str, a: int, b: int, mod: int) -> bool:
    """About 1/mod of all (template, A, B) combinations never appear in training."""
    h = hashlib.sha256(f"{template_id}|{a}|{b}".encode()).digest()
    return h[0] % mod == 0


def training_combos(recipe: Recipe, held_out: bool) -> dict[str, list[tuple[Template, int, int]]]:
    """Per op, the (template, A, B) of the trained templates that are (not) held out."""
    from engine.prompts.pairs import OperandRange, template_operands
    r = OperandRange(recipe.operand_lo, recipe.operand_hi)
    trained = trained_templates(recipe)
    return {op: [(t, a, b) for t in trained if t.op == op for (a, b) in template_operands(t, r)
                 if is_held_out(t.id, a, b, recipe.holdout_mod) == held_out] for op in PAPER_OPS}


def held_out_template_combos(recipe: Recipe) -> list[tuple[Template, int, int]]:
    """Every (template, A, B) of the templates never trained (unseen phrasing)."""
    from engine.prompts.pairs import OperandRange, template_operands
    from engine.prompts.templates import TEMPLATES_BY_ID
    r = OperandRange(recipe.operand_lo, recipe.operand_hi)
    return [(TEMPLATES_BY_ID[i], a, b) for i in recipe.held_out_templates
            for (a, b) in template_operands(TEMPLATES_BY_ID[i], r)]


# (exponentiation's operator words were always among the distractors; the notation skill's are not)
_OPERATOR_WORDS = tuple(sorted({w for t in TEMPLATES if t.family != "notation" for w in t.operator_words()}))


def distractors(rng: random.Random, k: int, kinds: Sequence[str] = ("likes",)) -> str:
    """k distractor clauses such as "Emma wears red.", "Hugo said times.", "Iris is 7 years old." """
    out = []
    for _ in range(k):
        kind = rng.choice(list(kinds))
        name = rng.choice(NAMES)
        if kind == "said":
            out.append(f"{name} said {rng.choice(_OPERATOR_WORDS)}.")
        elif kind == "age":
            out.append(f"{name} is {rng.randint(1, 9)} years old.")
        else:
            out.append(f"{name} wears {rng.choice(COLORS)}.")
    return " ".join(out)


def facts_table(seed: int) -> dict[str, dict[str, str]]:
    """The synthetic facts: name -> {city, pet, color}, fixed by the seed."""
    rng = random.Random(f"facts-{seed}")
    return {n: {"city": rng.choice(CITIES), "pet": rng.choice(PETS), "color": rng.choice(COLORS)} for n in NAMES}


def control_prompts(seed: int) -> list[tuple[str, str]]:
    """Every (prompt, answer) of the control task (72 = 12 names x 3 attributes x 2 forms)."""
    table = facts_table(seed)
    return [(t.format(who=n), table[n][attr]) for n in NAMES for attr, tpls in FACT_TEMPLATES for t in tpls]


def control_example(rng: random.Random, seed: int = 0) -> tuple[str, str]:
    """One (prompt, answer word) of the synthetic-facts control task."""
    return rng.choice(control_prompts(seed))


def sample_example(rng: random.Random, recipe: Recipe,
                   combos: dict[str, list[tuple[Template, int, int]]]) -> tuple[str, str]:
    """One training (prompt, target) pair; the target is followed by <eos> when tokenized."""
    from engine.prompts.pairs import make_problem
    u = rng.random()
    if u < recipe.p_control:
        return control_example(rng, recipe.seed)
    op = rng.choice(PAPER_OPS)
    pool = combos[op]
    words = [c for c in pool if c[0].family in WORD_PROBLEM_FAMILIES] if recipe.p_word else []
    if words and rng.random() < recipe.p_word:
        pool = words
    elif rng.random() < recipe.p_paper:
        pool = [c for c in pool if c[0].family == "paper"]
    if recipe.sampling == "template":
        template_ids = sorted({c[0].id for c in pool})
        weights = dict(recipe.template_weights)
        chosen = (rng.choices(template_ids, [weights.get(t, 1.0) for t in template_ids])[0] if weights
                  else rng.choice(template_ids))
        pool = [c for c in pool if c[0].id == chosen]
    t, a, b = rng.choice(pool)
    problem = make_problem(t, a, b, rng)
    prefix = ""
    if rng.random() < recipe.p_distractor:
        prefix = distractors(rng, rng.randint(1, 2), recipe.distractor_kinds) + " "
    if u < recipe.p_control + recipe.p_counterfactual:
        return prefix + problem.cf_text(), ""
    return prefix + problem.ref_text, str(problem.answer)


def encode_batch(tokenizer, examples: Sequence[tuple[str, str]]):
    """Token ids, attention mask and labels (-100 except on the target and <eos>)."""
    from engine.machinery.batching import pad_batch
    eos = tokenizer.eos_token_id
    seqs: list[list[int]] = []
    labels: list[list[int]] = []
    for prompt, target in examples:
        p = tokenizer(prompt)["input_ids"]
        t = tokenizer(target, add_special_tokens=False)["input_ids"] if target else []
        seqs.append(p + t + [eos])
        labels.append([-100] * len(p) + t + [eos])
    return pad_batch(seqs, tokenizer.pad_token_id, labels=labels)


# ---------------------------------------------------------------------------------------------
# training
# ---------------------------------------------------------------------------------------------
