"""Number representations (engine.techniques.numbers): every quantity against a plain reference.

Probe scores vs a hand-written fold loop (the same sklearn estimator on the same folds; ridge in numpy),
the DFT vs an explicit sum, the helix R² vs the normal equations, the causal check vs a per-prompt loop;
activations vs one unpadded forward per prompt; positions checked by their decoded tokens; cached ==
uncached; the CLI's output and its bad inputs.  On the bundled model and on SmolLM2 (few prompts, few layers).
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from engine.backends import hooks
from engine.prompts.pairs import answer_tokens
from engine.prompts.promptsets import PromptSetSpec
from engine.techniques import numbers as N
from engine.techniques.accuracy import kept_pairs
from tests.helpers.cli import run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def add_pairs(organism):
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=100, seed=0))
    return pairs


@pytest.fixture(scope="module")
def plain(organism, add_pairs):
    """The reference activations of layers -1 and 4 (embedding, and where C first decodes)."""
    return plain_residuals(organism, add_pairs, [-1, 4])


# ---------------------------------------------------------------------------------------------
# plain references
# ---------------------------------------------------------------------------------------------

def digits_of(token: str) -> str:
    return token.lstrip("▁Ġ#").strip()


def check_positions(backend, pairs) -> None:
    """END is the last prompt token, right before the answer; A and B are the operands' last digits."""
    tok = backend.tokenizer
    for p in pairs:
        at = N.positions(backend, p)
        toks = [str(t) for t in tok.convert_ids_to_tokens(p.ref_ids)]
        assert at["END"] == len(p.ref_ids) - 1
        assert not any(c.isdigit() for c in toks[at["END"]]), (p.ref_text, toks)
        assert answer_tokens(tok, p.ref_text, p.answer).prompt_ids == p.ref_ids  # the answer starts after END
        assert digits_of(toks[at["A"]]) == str(p.a)[-1], (p.ref_text, toks, at)
        assert digits_of(toks[at["B"]]) == str(p.b)[-1], (p.ref_text, toks, at)
        assert p.ref_text.rstrip().endswith(tok.convert_tokens_to_string([toks[-1]]).strip())


@torch.no_grad()
def plain_residuals(backend, pairs, layers) -> dict[int, np.ndarray]:
    """{layer: [3, P, d]}: one unpadded forward per prompt, at the positions of :func:`check_positions`."""
    names = {layer: hooks.resid_pre(0) if layer < 0 else hooks.resid_post(layer) for layer in layers}
    out = {layer: np.zeros((3, len(pairs), backend.facts.d_model)) for layer in layers}
    for i, p in enumerate(pairs):
        _, c = backend.run_with_cache(torch.tensor([p.ref_ids]), None, list(names.values()))
        at = N.positions(backend, p)
        for layer, name in names.items():
            for j, pos in enumerate(N.POSITIONS):
                out[layer][j, i] = c[name][0, at[pos]].double().cpu().numpy()
    return out


def hand_logistic(X, y, seed=0, folds=N.FOLDS) -> float:
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    labels = np.unique(y, return_inverse=True)[1]
    proto = make_pipeline(StandardScaler(), LogisticRegression(C=N.LOGREG_C, solver="newton-cg", max_iter=1000))
    right = 0
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, labels):
        est = clone(proto).fit(X[train], labels[train])
        right += int((est.predict(X[test]) == labels[test]).sum())
    return right / len(y)


def hand_kappa(X, y, seed=0, folds=N.FOLDS) -> float:
    """Cohen's kappa of the pooled held-out predictions of a hand fold loop, by its formula (p_o - p_e) / (1 - p_e)."""
    from sklearn.base import clone
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    proto = make_pipeline(StandardScaler(), LogisticRegression(C=N.LOGREG_C, solver="newton-cg", max_iter=1000))
    pred = np.empty_like(y)
    for train, test in StratifiedKFold(folds, shuffle=True, random_state=seed).split(X, y):
        pred[test] = clone(proto).fit(X[train], y[train]).predict(X[test])
    p_o = float((pred == y).mean())
    p_e = sum(float((y == c).mean() * (pred == c).mean()) for c in np.unique(np.concatenate([y, pred])))
    return (p_o - p_e) / (1 - p_e)


def hand_ridge(X, y, seed=0, folds=N.FOLDS) -> float:
    """Pooled held-out R² of ridge in plain numpy: standardize on the training fold, closed form, intercept."""
    from sklearn.model_selection import KFold
    pred = np.zeros_like(y)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(X):
        mu, sd = X[train].mean(0), X[train].std(0)
        sd[sd == 0] = 1.0
        A, B = (X[train] - mu) / sd, (X[test] - mu) / sd
        ym = y[train].mean()
        w = np.linalg.solve(A.T @ A + N.RIDGE_ALPHA * np.eye(A.shape[1]), A.T @ (y[train] - ym))
        pred[test] = B @ w + ym
    return 1 - ((y - pred) ** 2).sum() / ((y - y.mean()) ** 2).sum()


def hand_class_folds(y):
    """(k, mask): 5 folds and values with 5 prompts each, or 4 and 4, or 3 and 3 -- whichever keeps the most prompts
    (the more folds on a tie) with two values or more."""
    best = None
    for k in (5, 4, 3):
        ok = [v for v in set(y.tolist()) if (y == v).sum() >= k]
        mask = np.isin(y, ok)
        if len(ok) >= 2 and (best is None or mask.sum() > best[1].sum()):
            best = (k, mask)
    return best


def hand_circular(X, d, seed=0, folds=N.FOLDS) -> float:
    """The circular digit probe by hand: closed-form ridge (standardized on the training fold, intercept) onto
    (cos, sin) of 2π d / 10, the digit read back as the nearest of the ten points on the circle."""
    from sklearn.model_selection import KFold
    pts = np.array([[np.cos(2 * np.pi * k / 10), np.sin(2 * np.pi * k / 10)] for k in range(10)])
    Y = pts[d]
    pred = np.zeros_like(Y)
    for train, test in KFold(folds, shuffle=True, random_state=seed).split(X):
        mu, sd = X[train].mean(0), X[train].std(0)
        sd[sd == 0] = 1.0
        A, B = (X[train] - mu) / sd, (X[test] - mu) / sd
        ym = Y[train].mean(0)
        w = np.linalg.solve(A.T @ A + N.RIDGE_ALPHA * np.eye(A.shape[1]), A.T @ (Y[train] - ym))
        pred[test] = B @ w + ym
    unit = pred / np.linalg.norm(pred, axis=1, keepdims=True)
    return float(((unit @ pts.T).argmax(1) == d).mean())  # the nearest point = the nearest angle


def eig_pca_r2(X, r) -> float:
    """Top-r eigenvalues of the covariance over their sum."""
    ev = np.sort(np.linalg.eigvalsh(np.cov(X.T)))[::-1]
    return float(ev[:r].sum() / ev.sum())


def normal_eq_r2(B, X) -> float:
    W = np.linalg.pinv(B) @ X
    return 1 - ((X - B @ W) ** 2).sum() / ((X - X.mean(0)) ** 2).sum()


def explicit_dft_magnitude(V: np.ndarray) -> np.ndarray:
    """||Σ_n V[n] e^{-2πikn/N}|| for k = 1..N//2, as a plain sum."""
    Nn = V.shape[0]
    out = []
    for k in range(1, Nn // 2 + 1):
        acc = np.zeros(V.shape[1], dtype=complex)
        for n in range(Nn):
            acc += V[n] * np.exp(-2j * np.pi * k * n / Nn)
        out.append(np.sqrt((np.abs(acc) ** 2).sum()))
    return np.array(out)


@torch.no_grad()
def per_prompt_top(backend, pairs, layer, shift) -> np.ndarray:
    """Top next token of each prompt run alone with shift[i] added to resid_post[layer] at its last position."""
    out = []
    for p, s in zip(pairs, shift):
        def add(act, s=s):
            act = act.clone()
            act[0, -1] += torch.tensor(s, dtype=act.dtype, device=act.device)
            return act
        with backend.hooks([(hooks.resid_post(layer), add)]):
            logits = backend.logits(torch.tensor([p.ref_ids]))
        out.append(int(logits[0, -1].argmax()))
    return np.array(out)


# ---------------------------------------------------------------------------------------------
# the bundled model
# ---------------------------------------------------------------------------------------------

def test_positions_are_end_and_the_operands_last_digits(organism, add_pairs):
    check_positions(organism, add_pairs[:40])
    toks = organism.tokenizer.convert_ids_to_tokens(add_pairs[0].ref_ids)
    at = N.positions(organism, add_pairs[0])
    assert add_pairs[0].ref_text == "Q: How much is 2 plus 2? A:"
    assert (toks[at["A"]], toks[at["B"]], toks[at["END"]]) == ("2", "2", ":")


def test_activations_equal_one_plain_forward_per_prompt(organism, add_pairs, plain):
    X = N.residuals(organism, add_pairs, [-1, 4])
    for j, layer in enumerate((-1, 4)):
        np.testing.assert_allclose(X[j], plain[layer], atol=1e-4, rtol=1e-4)


def test_probe_scores_equal_a_hand_written_fold_loop(organism, add_pairs, plain):
    layer = 4
    rows = N.number_probes(organism, add_pairs, layers=[layer])
    X = plain[layer]
    vals = N.target_values(add_pairs)
    got = {(r.position, r.target, r.method): r for r in rows}
    mods = [r for r in rows if r.method.startswith("mod")]
    digit_rows = [r for r in rows if r.method.startswith("digit")]
    assert len(rows) - len(mods) - len(digit_rows) == len(N.POSITIONS) * len(N.TARGETS) * 5
    assert 0 < len(mods) <= len(N.PERIODS)
    c = vals["C"].astype(int)
    for r in mods:  # C mod T at END: kappa of the held-out logistic probe, classes with k prompts, k folds
        labels = np.mod(c, int(r.method[3:]))
        k, keep = hand_class_folds(labels)
        assert (r.position, r.target, r.n_prompts, r.folds) == ("END", "C", int(keep.sum()), k)
        assert r.score == pytest.approx(hand_kappa(X[0][keep], labels[keep], folds=k), abs=0.03)
    # per-digit circular probes: the units digit of every target, the tens digit where one is >= 10 (C here)
    assert {(r.target, r.method) for r in digit_rows if r.position == "END"} == {
        (t, "digit1") for t in N.TARGETS} | {("C", "digit10")}
    for r in digit_rows:
        y = vals[r.target].astype(int)
        place = int(r.method[5:])
        d = (y // place) % 10
        x = X[N.POSITIONS.index(r.position)]
        assert r.score == pytest.approx(hand_circular(x, d), abs=1e-9)
        assert r.baseline == pytest.approx(hand_circular(x, np.random.default_rng(0).permutation(d)), abs=1e-9)
        assert r.n_classes == len(np.unique(d))
    for pi, pos in enumerate(N.POSITIONS):
        for t in N.TARGETS:
            y = vals[t]
            k, keep = hand_class_folds(y)
            yk, xk = y[keep], X[pi][keep]
            r = got[(pos, t, "logistic")]
            assert (r.n_prompts, r.n_classes, r.folds) == (int(keep.sum()), len(np.unique(yk)), k)
            assert r.score == pytest.approx(hand_logistic(xk, yk, folds=k), abs=0.02)
            perm = np.random.default_rng(0).permutation(yk)
            assert r.baseline == pytest.approx(hand_logistic(xk, perm, folds=k), abs=0.02)
            r = got[(pos, t, "ridge")]
            assert r.score == pytest.approx(hand_ridge(X[pi], y), abs=1e-4)
            assert r.baseline == pytest.approx(hand_ridge(X[pi], np.random.default_rng(0).permutation(y)), abs=1e-4)
            r = got[(pos, t, "helix")]
            helix = np.stack([f(2 * np.pi * y / T) for T in (2, 5, 10, 100) for f in (np.cos, np.sin)]
                             + [y, np.ones_like(y)], 1)
            assert r.score == pytest.approx(normal_eq_r2(helix, X[pi]), abs=1e-6)
            assert r.baseline == pytest.approx(normal_eq_r2(np.stack([y, np.ones_like(y)], 1), X[pi]), abs=1e-6)
            assert r.score >= r.baseline - 1e-9
            means = got[(pos, t, "means")]
            onehot = (y[:, None] == np.unique(y)[None]).astype(float)
            assert means.score == pytest.approx(normal_eq_r2(onehot, X[pi]), abs=1e-6)
            if len(np.unique(y)) <= 9:  # the helix basis (rank 9 on integers) spans every function of n
                assert r.score == pytest.approx(means.score, abs=1e-6)
            pca = got[(pos, t, "pca")]  # the best subspace of the helix's dimension explains at least as much
            rank = np.linalg.matrix_rank(helix[:, :-1] - helix[:, :-1].mean(0))
            assert pca.score == pytest.approx(eig_pca_r2(X[pi], rank), abs=1e-6)
            assert pca.baseline == pytest.approx(r.score, abs=1e-9) and pca.score >= r.score - 1e-9


def test_acceptance_on_the_bundled_model(organism, add_pairs):
    rows = N.number_probes(organism, add_pairs, layers=[-1, 0, organism.facts.n_layers - 1])
    get = {(r.layer, r.position, r.target, r.method): r for r in rows}
    last = get[(organism.facts.n_layers - 1, "END", "C", "logistic")]
    assert last.score >= 0.9 and last.baseline <= 0.35
    assert get[(0, "A", "A", "logistic")].score >= 0.9
    assert get[(0, "A", "B", "logistic")].score < 0.5  # B comes after A: nothing of it at A's position


def test_probes_fitted_in_worker_processes_equal_those_fitted_here(organism, add_pairs, monkeypatch):
    """One process per core fits the layers' probes (joblib); on one core (``LOKY_MAX_CPU_COUNT=1``, as the test
    workers run) the fits run in this process one by one: the same rows either way, and the estimate counts the
    workers the fit uses."""
    layers = [0, organism.facts.n_layers - 1]
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert N.probes.fit_workers(len(layers)) == 1
    here = N.number_probes(organism, add_pairs, layers=layers)
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "2")
    assert N.probes.fit_workers(len(layers)) == 2 and N.probes.fit_workers(1) == 1
    assert N.number_probes(organism, add_pairs, layers=layers) == here


def test_spectrum_equals_the_explicit_dft(organism, add_pairs):
    nums, ids = N.number_range(organism, add_pairs[0].ref_text)
    assert nums == list(range(10))  # the bundled tokenizer writes numbers digit by digit
    assert [digits_of(t) for t in organism.tokenizer.convert_ids_to_tokens(ids)] == [str(n) for n in nums]
    vecs = N.number_vectors(organism, ids)
    with torch.no_grad():
        _, c = organism.run_with_cache(torch.tensor([ids]), None, [hooks.resid_pre(0)])
    np.testing.assert_allclose(vecs["embedding"], c[hooks.resid_pre(0)][0].double().numpy(), atol=1e-6)
    W_U, _ = organism.unembed()
    np.testing.assert_allclose(vecs["unembedding"], W_U[:, ids].T.double().numpy(), atol=1e-7)
    rows = N.number_spectrum(organism, add_pairs)
    for space in ("embedding", "unembedding"):
        mine = [r for r in rows if r.space == space]
        ref = explicit_dft_magnitude(vecs[space])
        np.testing.assert_allclose([r.magnitude for r in mine], ref, rtol=1e-9)
        np.testing.assert_allclose([r.period for r in mine], [10 / k for k in range(1, 6)])
        assert sum(r.share for r in mine) == pytest.approx(1.0)
        top = set(np.argsort(-ref)[:N.N_DOMINANT] + 1)
        assert {r.k for r in mine if r.dominant} == top


def test_circle_is_the_projection_on_the_fitted_directions(organism, add_pairs, plain):
    pts = N.helix_circle(organism, add_pairs, 4, "END", "C")
    X = plain[4][0]
    y = N.target_values(add_pairs)["C"]
    T = pts[0].period
    B = N.helix_basis(y)
    W = np.linalg.pinv(B) @ X
    j = list(N.PERIODS).index(T)
    Q, _ = np.linalg.qr(W[2 * j:2 * j + 2].T)
    xy = (X - X.mean(0)) @ Q
    np.testing.assert_allclose([[p.x, p.y] for p in pts], xy, rtol=1e-4, atol=1e-3 * np.abs(xy).max())
    parts = [((B[:, 2 * i:2 * i + 2] @ W[2 * i:2 * i + 2]) - (B[:, 2 * i:2 * i + 2] @ W[2 * i:2 * i + 2]).mean(0))
             for i in range(len(N.PERIODS))]
    assert T == N.PERIODS[int(np.argmax([(p ** 2).sum() for p in parts]))]


def test_causal_check_equals_a_per_prompt_loop(organism, add_pairs, plain):
    layer = 4
    rows = N.causal_check(organism, add_pairs, layer)
    X = plain[layer][0]
    plan = N.causal_plan(organism, add_pairs, X)
    moved = [add_pairs[i] for i in plan.idx]
    for p, cp, t in zip(moved, plan.target, plan.target_token):  # C' is another value with another first token
        assert cp != p.answer and t != p.answer_id
        assert t == answer_tokens(organism.tokenizer, p.ref_text, int(cp)).answer_id
    # the shift is the difference of the class means
    c = N.target_values(add_pairs)["C"]
    i0 = plan.idx[0]
    ref_shift = X[c == plan.target[0]].mean(0) - X[c == c[i0]].mean(0)
    np.testing.assert_allclose(plan.shift[0], ref_shift, atol=1e-3)
    got = {r.method: r for r in rows}
    for method, S in (("class-means", plan.shift), ("random", plan.random)):
        top = per_prompt_top(organism, moved, layer, S)
        assert got[method].n_prompts == len(moved)
        assert got[method].success == pytest.approx((top == np.array(plan.target_token)).mean())
        assert got[method].stays == pytest.approx((top == np.array([p.answer_id for p in moved])).mean())
    np.testing.assert_allclose(np.linalg.norm(plan.random, axis=1), np.linalg.norm(plan.shift, axis=1))
    assert got["class-means"].success > got["random"].success


@torch.no_grad()
def per_prompt_patched(backend, pairs, layer, at, new_vectors, want) -> tuple[np.ndarray, np.ndarray]:
    """Each prompt run alone with the residual leaving ``layer`` at position at[i] *replaced* by new_vectors[i]:
    (top token at the last position, logit[want[i, 0]] - logit[want[i, 1]])."""
    top, ld = [], []
    name = hooks.resid_pre(0) if layer < 0 else hooks.resid_post(layer)
    for p, a, v, w in zip(pairs, at, new_vectors, want):
        def put(act, a=a, v=v):
            act = act.clone()
            act[0, a] = torch.tensor(v, dtype=act.dtype, device=act.device)
            return act
        with backend.hooks([(name, put)]):
            logits = backend.logits(torch.tensor([p.ref_ids]))[0, -1]
        top.append(int(logits.argmax()))
        ld.append(float(logits[w[0]] - logits[w[1]]))
    return np.array(top), np.array(ld)


def check_helix_patch(backend, pairs, layer, position, target, X, n_loop=None):
    """The rows of helix_patch against the docstring's formulas computed here and a per-prompt loop that writes the
    patched vector (x_i + δ_i) into an unpadded run of each prompt."""
    from engine.techniques import helix_patch as H
    rows = {r.method: r for r in H.helix_patch(backend, pairs, layer, position, target)}
    d = H.donors(backend, pairs, target)
    n = N.target_values(pairs)[target]
    for i, j, t in zip(d.idx, d.donor, d.new_token):  # a donor with another value and another first answer token
        p = pairs[i]
        c = int(n[j]) if target == "C" else {"add": np.add, "sub": np.subtract, "mul": np.multiply}[p.op](
            *((int(n[j]), int(p.b)) if target == "A" else (int(p.a), int(n[j]))))
        assert n[j] != n[i] and c >= 0 and t != p.answer_id
        assert t == answer_tokens(backend.tokenizer, p.ref_text, c).answer_id
    B = np.stack([f(2 * np.pi * n / T) for T in (2, 5, 10, 100) for f in (np.cos, np.sin)] + [n, np.ones_like(n)], 1)
    W = np.linalg.pinv(B) @ X
    r = np.linalg.matrix_rank(B[:, :-1] - B[:, :-1].mean(0))
    ev, V = np.linalg.eigh(np.cov(X.T))
    P = V[:, np.argsort(ev)[::-1][:r]]
    i, j = np.array(d.idx), np.array(d.donor)
    new = {"none": X[i], "full": X[j], "helix": X[i] + (B[j] - B[i]) @ W, "pca": X[i] + (X[j] - X[i]) @ P @ P.T}
    moved = [pairs[k] for k in d.idx]
    at = [N.positions(backend, p)[position] for p in moved]
    want = np.array([[t, p.answer_id] for t, p in zip(d.new_token, moved)])
    m = len(moved) if n_loop is None else n_loop
    ld = {}
    for name, V_new in new.items():
        top, ld[name] = per_prompt_patched(backend, moved[:m], layer, at[:m], V_new[:m], want[:m])
        assert rows[name].rank == r and rows[name].n_prompts == len(moved)
        if n_loop is None:
            assert rows[name].success == pytest.approx((top == want[:, 0]).mean())
            assert rows[name].stays == pytest.approx((top == want[:, 1]).mean())
            assert rows[name].logit_diff == pytest.approx(ld[name].mean(), abs=1e-3)
        else:  # the batched run's own success on the first prompts
            from engine.techniques.numbers import shifted_readout
            _, delta = H.shifts(X, n, d)
            got, _ = shifted_readout(backend, moved[:m], layer, at[:m], delta[name][:m])
            np.testing.assert_array_equal(got, top)
    if n_loop is None:
        span = ld["full"].mean() - ld["none"].mean()
        assert rows["helix"].recovered == pytest.approx((ld["helix"].mean() - ld["none"].mean()) / span, abs=1e-3)
        assert rows["helix"].success_low <= rows["helix"].success <= rows["helix"].success_high
    return rows


def test_helix_patch_equals_a_per_prompt_loop(organism, add_pairs, plain):
    """The bundled model at the embedding, operand A at its own token: the full activation, the helix and PCA of the
    same dimension all move the answer; a random subspace of that dimension does not."""
    rows = check_helix_patch(organism, add_pairs, -1, "A", "A", plain[-1][1])
    assert rows["none"].success == 0 and rows["none"].stays == 1
    assert rows["full"].success >= 0.9 and rows["helix"].success >= 0.9 and rows["random"].success_high < 0.2
    rows = check_helix_patch(organism, add_pairs, 4, "END", "C", plain[4][0])
    assert rows["helix"].recovered_low > rows["random"].recovered_high


def check_continued_equals_full(backend, pairs, layer):
    """Shifts at END continued from each prompt's own prefix = the same shifts in full padded passes; END logits
    that the continuation does not reproduce send it back to the full passes (None)."""
    X, lg = N.residuals_and_end_logits(backend, pairs, [layer])
    rng = np.random.default_rng(1)
    scale = np.linalg.norm(X[0, 0], axis=1, keepdims=True)
    shifts = [np.zeros_like(X[0, 0]), rng.standard_normal(X[0, 0].shape) * scale / np.sqrt(X.shape[-1]) * 3]
    tokens = np.array([[p.answer_id, (p.answer_id + 1) % backend.facts.vocab_size] for p in pairs])
    got = N.continued_readouts(backend, pairs, layer, shifts, tokens, lg)
    assert got is not None
    for (top, picked), shift in zip(got, shifts):
        want_top, want_picked = N.shifted_readout(backend, pairs, layer, None, shift, tokens)
        assert (top == want_top).mean() >= 0.97  # a near-tie may flip within float32
        np.testing.assert_allclose(picked, want_picked, atol=2e-3 * np.abs(want_picked).max())
    assert (got[0][0] == np.array([p.answer_id for p in pairs])).all()  # unshifted: the kept answers
    assert N.continued_readouts(backend, pairs, layer, shifts, tokens, lg + 1.0) is None


def test_shifts_at_end_continue_each_prompts_prefix(organism, add_pairs):
    check_continued_equals_full(organism, add_pairs, 4)


def same_streams(got: np.ndarray, want: np.ndarray) -> None:
    """Residual streams of two ways of computing the same pass: float32 values reaching ~90 (an ulp there ~8e-6),
    summed in another order, so within 1e-5 of the streams' scale (full runs on one thread found them 1.2e-4 apart,
    on another CPU 5e-5; a wrong prefix or position moves them by units)."""
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def test_one_pass_and_one_prefix_serve_every_step_of_a_prompt_set(organism, add_pairs, monkeypatch):
    """Probes, circle, helix patching and the causal check of one prompt set run one residual pass, which keeps the
    prompts' keys and values for the shifts at END (one pass per chunk of equal length, nothing else); it equals the
    padded pass, and the backends' two-pass default equals the bridge's one pass.  Another prompt set runs its own;
    where continuing does not pay or the prefix is too large to keep, the padded pass runs."""
    from engine.backends.base import ModelBackend
    from engine.machinery.batching import TOKENS_PER_PASS, length_chunks
    from engine.techniques import helix_patch as H
    from engine.techniques.numbers import activations, shifts
    calls = {"padded": 0, "fused": 0, "one pass": 0, "prefix": 0}
    real = {"padded": N.residuals_and_end_logits, "fused": N.residuals_and_prefixes,
            "one pass": organism.prefix_with_cache_at, "prefix": organism.prefix}

    def counted(name):
        def fn(*a, **k):
            calls[name] += 1
            return real[name](*a, **k)
        return fn
    monkeypatch.setattr(activations, "residuals_and_end_logits", counted("padded"))  # where residual_pass reads it
    monkeypatch.setattr(activations, "residuals_and_prefixes", counted("fused"))
    monkeypatch.setattr(organism, "prefix_with_cache_at", counted("one pass"))
    monkeypatch.setattr(organism, "prefix", counted("prefix"))
    for module in (activations, shifts):  # the bundled model is small enough for either
        monkeypatch.setattr(module, "continuation_pays", lambda *a: True)
    pairs = add_pairs[:-1]  # a prompt set no other test has remembered
    N.number_probes(organism, pairs, layers=[4])
    N.helix_circle(organism, pairs, 4, "END", "C")
    H.helix_patch(organism, pairs, 4, "END", "C")
    N.causal_check(organism, pairs, 4)
    H.helix_patch(organism, pairs, 2, "END", "A")
    chunks = length_chunks(pairs, TOKENS_PER_PASS)
    assert calls == {"padded": 0, "fused": 1, "one pass": len(chunks), "prefix": 0}
    layers = N.all_layers(organism)
    (X, lg), _ = real["fused"](organism, pairs, layers)
    X_pad, lg_pad = real["padded"](organism, pairs, layers)
    same_streams(X, X_pad)
    torch.testing.assert_close(lg, lg_pad, atol=1e-4, rtol=0)
    idx = list(chunks[0])
    ids = torch.tensor([pairs[i].ref_ids for i in idx])
    pos = torch.tensor([[N.positions(organism, pairs[i])[n] for n in N.POSITIONS] for i in idx])
    names = [N.resid_hook(x) for x in layers]
    _, lg1, acts1 = real["one pass"](ids, names, pos)
    _, lg2, acts2 = ModelBackend.prefix_with_cache_at(organism, ids, names, pos)
    torch.testing.assert_close(lg1, lg2, atol=1e-4, rtol=0)
    for n in names:
        same_streams(acts1[n].float().numpy(), acts2[n].float().numpy())
    X = N.layer_residuals(organism, add_pairs, [-1, 4])  # the last set remembered was the other one
    assert calls["fused"] == 2
    same_streams(X, real["padded"](organism, add_pairs, [-1, 4])[0])
    monkeypatch.setattr(activations, "KEEP_PREFIX_BYTES", 0)  # too large to keep (a big model on a GPU): made per call
    other, before = add_pairs[:-2], dict(calls)
    assert H.helix_patch(organism, other, 4, "END", "C") == H.helix_patch(organism, other, 4, "END", "C")
    assert calls["padded"] == before["padded"] + 1 and calls["fused"] == before["fused"]
    assert calls["prefix"] == before["prefix"] + 2 * len(length_chunks(other, TOKENS_PER_PASS))


def test_cached_equals_uncached_and_the_finding(organism, add_pairs, tmp_path):
    from cache import ResultCache
    cache = ResultCache(tmp_path / "c.duckdb")
    fresh, computed = N.cached_number_probes(organism, add_pairs, cache=cache)
    again, computed2 = N.cached_number_probes(organism, add_pairs, cache=cache)
    assert computed and not computed2 and fresh == again
    plain, _ = N.cached_number_probes(organism, add_pairs, layers=[0, 7])
    assert plain == [r for r in fresh if r.layer in (0, 7)]
    spec1, _ = N.cached_number_spectrum(organism, add_pairs, cache=cache)
    spec2, c2 = N.cached_number_spectrum(organism, add_pairs, cache=cache)
    assert spec1 == spec2 == N.cached_number_spectrum(organism, add_pairs)[0] and not c2
    layer = N.causal_layer(fresh)
    assert layer == N.first_decode_layer(fresh)
    assert N.finding(organism, add_pairs, cache, None).startswith(
        f"A linear probe reads C from the last token's residual stream from layer {layer} on")
    cc1, _ = N.cached_causal_check(organism, add_pairs, layer, cache=cache)
    cc2, c3 = N.cached_causal_check(organism, add_pairs, layer, cache=cache)
    assert cc1 == cc2 == N.cached_causal_check(organism, add_pairs, layer)[0] and not c3
    assert "Moving it there" in N.finding(organism, add_pairs, cache, None)
    ci1, _ = N.cached_helix_circle(organism, add_pairs, layer, cache=cache)
    assert ci1 == N.cached_helix_circle(organism, add_pairs, layer, cache=cache)[0] == \
        N.cached_helix_circle(organism, add_pairs, layer)[0]


def test_too_few_prompts_per_value_is_a_clear_error(organism):
    pairs, _ = kept_pairs(organism, PromptSetSpec(ops=("add",), n=4, seed=0))
    with pytest.raises(ValueError, match="prompts per value"):
        N.number_probes(organism, pairs, layers=[0])


def test_cli_csv_json_and_bad_inputs(tmp_path):
    out = tmp_path / "n.csv"
    cache = tmp_path / "c.duckdb"
    r = run_cli("numbers", "--op", "add", "--n", "100", "--layers=-1,0,7", "--out", str(out),
                "--spectrum-out", str(tmp_path / "s.csv"), cache=cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(out.open()))
    assert list(rows[0])[:6] == ["layer", "position", "target", "method", "score", "baseline"]
    plain_rows = [x for x in rows if not x["method"].startswith(("mod", "digit"))]
    assert {x["layer"] for x in rows} == {"-1", "0", "7"} and len(plain_rows) == 3 * 9 * 5
    assert res["first_layer_C_decodes_at_END"] == 7 and res["last_layer"]["C@END"]["accuracy"] >= 0.9
    assert res["dominant_periods"]["embedding"] and {c["method"] for c in res["causal_check"]} == {
        "class-means", "random"}
    spectrum_rows = list(csv.DictReader((tmp_path / "s.csv").open()))  # digits 0-9: 5 frequencies per space
    assert len(spectrum_rows) == 15 and {x["space"] for x in spectrum_rows} == {
        "embedding", "unembedding", N.FREQUENCY_SPACE}
    for args, phrase in ((("--layers", "99"), "do not exist"), (("--layers", "x"), "comma list"),
                         (("--n", "2"), "prompts per value")):
        r = run_cli("numbers", "--op", "add", "--out", str(out), *args, cache=cache)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and phrase in lines[0], r.stderr


def test_helix_patch_cli_csv_json_and_bad_inputs(tmp_path):
    out = tmp_path / "p.csv"
    cache = tmp_path / "c.duckdb"
    r = run_cli("helix-patch", "--op", "add", "--n", "100", "--layer=-1", "--position", "A", "--target", "A",
                "--out", str(out), cache=cache)
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    rows = list(csv.DictReader(out.open()))
    assert [x["method"] for x in rows] == ["none", "full", "helix", "pca", "random"]
    assert res["layer"] == -1 and res["patches"]["helix"]["success"][0] >= 0.9  # as the bundled model's test
    assert res["patches"]["random"]["success"][2] < 0.2
    r = run_cli("helix-patch", "--op", "add", "--n", "100", "--out", str(out), cache=cache)  # the default layer
    assert r.returncode == 0 and json.loads(r.stdout)["layer"] == 4, r.stderr  # where C first decodes at END
    for args, phrase in ((("--layer", "99"), "do not exist"), (("--position", "Q"), "invalid choice")):
        r = run_cli("helix-patch", "--op", "add", "--n", "20", "--out", str(out), *args, cache=cache)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and len(lines) == 1 and phrase in lines[0], r.stderr


def test_page_renders_its_charts_and_a_bad_prompt_set_is_an_error(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.app.conftest import REPO, ask_all
    monkeypatch.setenv("ARITHLAB_CACHE", str(tmp_path / "page.duckdb"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for n, charts in ((40, 9), (2, 0)):  # probes 3 (class, scalar, digits), mod-T kappa, spectrum, helix 2, patch,
        #                              causal
        at = AppTest.from_file(str(REPO / "pages" / "10_Numbers.py"), default_timeout=300)
        at.session_state["prompt_set"] = {"ops": ["add"], "families": "paper (Fig. 8, 32 templates)", "n": n,
                                          "seed": 0}
        ask_all(at.run())  # on a busy machine the page asks before its probes (engine.cost)
        assert not at.exception, at.exception
        assert len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart")) == charts
        errors = [e.value for e in at.error]
        assert (errors == []) if charts else any("prompts per value" in e for e in errors), errors


# ---------------------------------------------------------------------------------------------
# SmolLM2 (few prompts, few layers)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smol():
    from tests.helpers.smollm2 import open_smollm2
    return open_smollm2()


@pytest.fixture(scope="module")
def smol_pairs(smol):
    pairs, _ = kept_pairs(smol, PromptSetSpec(ops=("add",), n=160, seed=0))
    return pairs


@pytest.mark.realmodel
def test_smollm2_positions_probes_spectrum_and_causal_check(smol, smol_pairs):
    check_positions(smol, smol_pairs[:20])
    p = smol_pairs[0]
    toks = [str(t) for t in smol.tokenizer.convert_ids_to_tokens(p.ref_ids)]
    at = N.positions(smol, p)
    assert digits_of(toks[at["A"]]) == str(p.a) and digits_of(toks[at["B"]]) == str(p.b)
    layer, last = smol.facts.n_layers // 2, smol.facts.n_layers - 1
    rows = N.number_probes(smol, smol_pairs, layers=[layer])
    both = N.residuals(smol, smol_pairs, [layer, last])
    plain = plain_residuals(smol, smol_pairs[:8], [layer, last])  # the batched activations, 8 prompts alone
    for j, at in enumerate((layer, last)):
        np.testing.assert_allclose(both[j][:, :8], plain[at], rtol=1e-3, atol=1e-3 * np.abs(plain[at]).max())
    X = both[0]
    vals = N.target_values(smol_pairs)
    got = {(r.position, r.target, r.method): r for r in rows}
    for pi, pos in ((0, "END"), (1, "A")):
        y = vals["A"]
        k, keep = hand_class_folds(y)
        assert got[(pos, "A", "logistic")].score == pytest.approx(hand_logistic(X[pi][keep], y[keep], folds=k),
                                                                  abs=0.03)
        assert got[(pos, "A", "ridge")].score == pytest.approx(hand_ridge(X[pi], y), abs=1e-3)
        helix = N.helix_basis(vals["C"])
        assert got[(pos, "C", "helix")].score == pytest.approx(normal_eq_r2(helix, X[pi]), abs=1e-5)
    a_at_a = got[("A", "A", "logistic")]  # A reads at its own token, far above shuffled labels
    assert a_at_a.score >= 0.85 and a_at_a.score >= a_at_a.baseline + 0.5
    nums, ids = N.number_range(smol, p.ref_text)
    assert len(nums) in (10, 100)
    vecs = N.number_vectors(smol, ids)
    spec = [r for r in N.number_spectrum(smol, smol_pairs) if r.space == "unembedding"]
    np.testing.assert_allclose([r.magnitude for r in spec], explicit_dft_magnitude(vecs["unembedding"]), rtol=1e-8)
    # the causal check: its batched, padded hook vs one prompt at a time (8 prompts)
    rows = {r.method: r for r in N.causal_check(smol, smol_pairs, last)}
    plan = N.causal_plan(smol, smol_pairs, both[1][0])
    moved = [smol_pairs[i] for i in plan.idx]
    assert rows["class-means"].n_prompts == len(moved)
    batched = N.shifted_top_tokens(smol, moved[:8], last, plan.shift[:8])
    np.testing.assert_array_equal(batched, per_prompt_top(smol, moved[:8], last, plan.shift[:8]))
    assert rows["class-means"].success > rows["random"].success
    check_continued_equals_full(smol, smol_pairs, layer)
    # helix-subspace patching at operand A's own token after the first block: the batched hook vs 6 prompts alone
    hp = check_helix_patch(smol, smol_pairs, 0, "A", "A", N.residuals(smol, smol_pairs, [0])[0, 1], n_loop=6)
    assert hp["full"].success > hp["random"].success_high
