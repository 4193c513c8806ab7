"""Transfer: are the key heads of one prompt set also the key heads of another? (Table 4)"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.cost import cost_of, observe
from engine.findings.as_code import transfer_code
from engine.numerics.intervals import SMALL_SET
from engine.prompts.promptsets import PromptSetSpec, format_spec, generate
from engine.prompts.templates import PAPER_FAMILIES
from engine.techniques.accuracy import answered_right, kept_pairs
from engine.techniques.transfer import benchmark_pairs, compare_work, transfer
from ui import url_state
from ui.as_code import code_view
from ui.progress import USER_ERRORS, cancellable, progress_bar
from ui.session import result_cache, setup_page


def show_transfer(res) -> None:
    st.metric("Shared key heads", f"{res.overlap} of {res.k}", help=f"Jaccard index {res.jaccard:.2f}")
    few = [s for s in (res.a, res.b) if s.n_pairs < SMALL_SET]  # the lab's rule (small_set_note)
    if few:
        rests = " and ".join(f"set {s.name} on {s.n_pairs} prompt pair{'s' if s.n_pairs != 1 else ''}" for s in few)
        st.warning(f"Too few pairs to trust this comparison: {rests} the model answers right (at least {SMALL_SET} "
                   f"per set are advised). On so few, a set's top-{res.k} key heads, the shared count and the "
                   f"knockout accuracies (one pair: each is 0 % or 100 %) could all move with another sample of "
                   f"prompts. Raise 'Prompts per op' in the sidebar (both sets are drawn with that many) and press "
                   f"Compare again.", icon=":material/warning:")
    df = pd.DataFrame([{"set": s.name, "pairs": s.n_pairs, "accuracy": s.accuracy,
                        "knock out own top-k": s.accuracy_ko_own, "knock out other's top-k": s.accuracy_ko_other,
                        "top heads": ", ".join(f"{a}.{b}" for a, b in s.top_heads)} for s in (res.a, res.b)])
    acc = ["accuracy", "knock out own top-k", "knock out other's top-k"]
    st.dataframe(df.style.format({c: "{:.1%}" for c in acc}), hide_index=True, width="stretch")
    st.caption("First-token accuracy on each set's prompts the model answers right without a knockout.")
    st.download_button("Transfer table (CSV)", df.to_csv(index=False).encode(), "transfer.csv", "text/csv")

model, spec = setup_page(
    "Transfer",
    "Path patching on the sidebar's prompt set (A) and on a second set (B): how many of their top-k key "
    "heads coincide, and how much each set's accuracy drops when its own or the other set's key heads "
    "are knocked out. If the heads transfer, both knockouts hurt.")

c1, c2, c3 = st.columns(3)
second = c1.selectbox("Second set (B)", url_state.TRANSFER_SETS, **url_state.bound("tr_set"))
n_heads = model.facts.n_layers * model.facts.n_heads
url_state.check("tr_k", range(1, n_heads + 1))
k = c2.number_input("Top k", 1, n_heads, **url_state.bound("tr_k", min(10, n_heads)))
data_dir = c3.text_input("Data directory (benchmarks)", "../shared/data")
inputs = {"second": second, "k": int(k), "data_dir": data_dir, "model": model.facts.fingerprint,
          "set": spec.to_params()}
kept = st.session_state.get("transfer_result")  # the last comparison is kept (app state) until the next one
cache = result_cache()
bench = "svamp" if second.startswith("SVAMP") else "gsm8k" if second.startswith("GSM8K") else None
if bench is not None and not Path(data_dir).is_dir():
    st.error(f"{data_dir} is not a directory: point it at a folder laid out like ../shared/data.")
    st.stop()
try:
    if bench is not None:
        spec_b, candidates_b = None, benchmark_pairs(model.tokenizer, data_dir, bench, spec.n, spec.seed)
    else:
        spec_b = (format_spec(spec, second.split(" ")[0]) if second.startswith(("word", "multi-digit", "decimals"))
                  else PromptSetSpec(ops=spec.ops, n=spec.n, seed=spec.seed + 1, families=PAPER_FAMILIES))
        candidates_b = generate(model.tokenizer, spec_b)[0]
    cost = cost_of(model, compare_work(model, spec, candidates_b, cache=cache))
except USER_ERRORS as e:
    st.error(f"Cannot compare: {e}")
    st.stop()
code_view(transfer_code(model, spec, spec_b, bench, data_dir, int(k)))
if not st.button(f"Compare ({cost.label()})", key="transfer_go",
                 help="Both sets: which prompts the model answers right, path patching, knockouts. The lab's cost "
                      "model: forward passes counted from the code, seconds measured on this machine."):
    if kept is None or kept["inputs"]["model"] != inputs["model"]:
        st.info("Pick the second set and press Compare.")
        st.stop()
    if kept["inputs"] != inputs:
        st.info(f"Showing the last comparison (second set: {kept['inputs']['second']}, top {kept['inputs']['k']}): "
                f"press Compare for the inputs above.")
    show_transfer(kept["result"])
    st.stop()
bar, cb = progress_bar("Comparing (both sets: answers, path patching, knockouts)", key="transfer", on_demand=True)
try:
    with cancellable(bar):
        t0 = time.monotonic()
        pairs_a, _ = kept_pairs(model, spec, cache=cache, progress=cb)
        pairs_b = answered_right(model, candidates_b, cache=cache, progress=cb)
        res = transfer(model, pairs_a, pairs_b, names=("A", "B"), k=int(k), cache=cache, progress=cb)
        observe(model, cost, time.monotonic() - t0)
except USER_ERRORS as e:
    bar.empty()
    st.error(f"Cannot compare: {e}")
    st.stop()
bar.empty()
st.session_state["transfer_result"] = {"inputs": inputs, "result": res}
show_transfer(res)
