"""Crashes: a CLI sweep killed with SIGKILL while it computes leaves no partial rows, and the next
run completes it with the same numbers as a run that was never interrupted."""

from __future__ import annotations

import json
import signal
import time

from tests.conftest import TIMINGS
from tests.reliability.conftest import cli_env, orphan_rows, snapshot, start_cli

SWEEP = ("knockout-curve", "--op", "all", "--n", "20", "--seed", "0", "--k-max", "6", "--draws", "4",
         "--device", "cpu")
KILL_AFTER = 0.3  # seconds into the knockout curve (which takes a few seconds on one CPU thread)


def _events(trace):
    return [json.loads(x) for x in trace.read_text().splitlines() if x.strip()] if trace.exists() else []


def test_sigkill_mid_sweep_leaves_no_partial_rows_and_rerun_completes(tmp_path):
    """The sweep stores three runs (the prompt filter, path patching, then the knockout curve). It is
    killed once the trace (ARITHLAB_TRACE) shows the curve computing: the two finished runs are
    whole, the curve left nothing, and a re-run computes only the curve and matches the reference."""
    ref_dir, crash_dir = tmp_path / "reference", tmp_path / "crashed"
    ref_dir.mkdir()
    crash_dir.mkdir()
    crash_trace = crash_dir / "trace.jsonl"
    t0 = time.time()
    reference = start_cli(*SWEEP, "--out", str(ref_dir / "curve.csv"), cache=None,
                          env=cli_env(ref_dir / "results.duckdb", ARITHLAB_TRACE=str(ref_dir / "trace.jsonl")))
    crashed = start_cli(*SWEEP, "--out", str(crash_dir / "curve.csv"), cache=None,
                        env=cli_env(crash_dir / "results.duckdb", ARITHLAB_TRACE=str(crash_trace)))
    deadline = time.time() + 300
    while not any(e["event"] == "compute-start" and e["method"] == "knockout_curve" for e in _events(crash_trace)):
        assert crashed.proc.poll() is None, crashed.result().err[-2000:]
        assert time.time() < deadline, "the sweep never started computing the knockout curve"
        time.sleep(0.05)
    time.sleep(KILL_AFTER)
    crashed.proc.send_signal(signal.SIGKILL)
    killed = crashed.result()
    assert killed.rc == -signal.SIGKILL
    ref = reference.result()
    assert ref.rc == 0, ref.err[-2000:]

    # killed mid-computation: the curve was never stored, no CSV was written
    events = _events(crash_trace)
    assert [(e["event"], e["method"]) for e in events] == [
        ("compute-start", "kept_prompts"), ("stored", "kept_prompts"),
        ("compute-start", "path_patching"), ("stored", "path_patching"),
        ("compute-start", "knockout_curve")]
    assert not (crash_dir / "curve.csv").exists()
    # no partial rows: exactly the two finished runs, each identical to the reference's run
    db, ref_db = crash_dir / "results.duckdb", ref_dir / "results.duckdb"
    after_kill, ref_runs = snapshot(db), snapshot(ref_db)
    assert sorted(v[0] for v in after_kill.values()) == ["kept_prompts", "path_patching"]
    assert all(ref_runs[run_id] == v for run_id, v in after_kill.items())
    assert orphan_rows(db) == 0

    # the next run completes it: only the curve is computed, the result equals the reference
    rerun = start_cli(*SWEEP, "--out", str(crash_dir / "curve.csv"), cache=None,
                      env=cli_env(db, ARITHLAB_TRACE=str(crash_trace))).result()
    assert rerun.rc == 0 and not rerun.err.strip(), rerun.err[-2000:]
    new_events = _events(crash_trace)[len(events):]
    assert [(e["event"], e["method"]) for e in new_events] == [("compute-start", "knockout_curve"),
                                                              ("stored", "knockout_curve")]
    assert snapshot(db) == ref_runs and orphan_rows(db) == 0
    assert (crash_dir / "curve.csv").read_text() == (ref_dir / "curve.csv").read_text()
    curve_s = new_events[1]["t"] - new_events[0]["t"]
    assert curve_s > 2 * KILL_AFTER, f"the curve took {curve_s:.2f}s: too short to be killed half way"
    res, ref_res = json.loads(rerun.out), json.loads(ref.out)
    assert res["cached"] is False and res["points"] == ref_res["points"]
    line = (f"reliability: SIGKILL mid-sweep ({SWEEP[0]}, {res['n_pairs']} pairs, k<=6 x 4 draws) + re-run "
            f"+ reference run: {time.time() - t0:.1f}s; killed {KILL_AFTER}s into a {curve_s:.1f}s computation; "
            f"the re-run recomputed 1 of 3 runs")
    print(line)
    TIMINGS.append(line)
