"""bench/drift.py at small settings (river's bundled data only: no download, a few seconds):
its output is complete and sane, and its recovery rule does what its docs say."""
import io
import re
import sys
from contextlib import redirect_stdout
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import drift as bench  # noqa: E402  (bench/drift.py)


def _table(out, title_start):
    """The rows of the table printed after the line starting with ``title_start``."""
    lines = out.splitlines()
    i = next(k for k, ln in enumerate(lines) if ln.startswith(title_start))
    rows = []
    for ln in lines[i + 3:]:
        if not ln.strip() or ln.startswith("["):
            break
        rows.append(re.split(r"\s{2,}", ln.strip()))
    return rows


def test_quick_run_prints_sane_tables(tmp_path):
    buf = io.StringIO()
    csv = tmp_path / "lpd.csv"
    with redirect_stdout(buf):
        bench.main(["--quick", "--seeds", "1", "--streams", "gmm,logistic", "--csv", str(csv)])
    out = buf.getvalue()
    assert "## gmm:" in out and "## logistic:" in out and "total" in out
    gmm, logistic = out.split("## logistic:")
    for text, learners in ((gmm, ["none", "fixed floor", "PH + floor", "PH + restart", "PH + reanneal",
                                  "ADWIN + floor"]),
                           (logistic, ["none", "fixed floor", "PH + floor", "PH + restart", "ADWIN + floor",
                                       "river DriftRetrainingClassifier"])):
        windows = _table(text, "prequential lpd")
        assert [r[0] for r in windows] == learners
        assert all(len(r) == 1 + bench.WINDOWS and all(np.isfinite(float(v)) for v in r[1:]) for r in windows)
        rec = {r[0]: r for r in _table(text, "recovery")}
        assert list(rec) == learners
        for r in rec.values():
            assert all(re.fullmatch(r"\d+( \(\d+ not\))?", v) for v in r[1:-3]), r
    # the learners without a detector detect nothing; the first change (a huge drop in lpd:
    # other classes of the image segments) is found by Page-Hinkley on the GMM stream
    rec = {r[0]: r for r in _table(gmm, "recovery")}
    assert rec["none"][-2] == rec["fixed floor"][-2] == "0"
    assert int(rec["PH + floor"][-2]) >= 1
    # the windows before the first change are the same for every engine learner without annealing
    windows = {r[0]: r for r in _table(gmm, "prequential lpd")}
    assert windows["none"][1:4] == windows["PH + floor"][1:4] == windows["fixed floor"][1:4]
    lines = csv.read_text().splitlines()
    assert lines[0] == "stream,seed,learner,batch,records,lpd" and len(lines) > 1000


def test_recovery_counts_records_from_the_change_to_the_reference():
    s = bench.Stream("x", batches=[np.zeros((10, 1))] * 20, changes=[10], make_engine=None, score=None,
                     unit="nats")
    lpds = [0.0] * 10 + [-10.0, -5.0, -2.0, -1.0, -0.5, -0.5, -0.5, -0.5, -0.5, -0.5]
    # reference -0.5, shock -10: the target is -0.5 - 0.1 * 9.5 = -1.45; the 3-batch moving mean
    # first reaches it at batch 14 ((-2 - 1 - 0.5) / 3 = -1.17): batches 10..14, 50 records
    assert bench.recovery(s, lpds, [-0.5], [-10.0]) == [50]
    assert bench.recovery(s, [0.0] * 10 + [-10.0] * 10, [-0.5], [-10.0]) == [">100"]


def test_promotion_run_keeps_a_poisoned_burst_from_the_scorers():
    """The daemon on the gmm stream with a burst of valid garbage: the snapshots that learned the
    burst are rejected, so a scorer following ``promoted`` serves the pre-burst model after it."""
    lines = []
    r = bench.promotion_run(True, out=lines.append)
    at, n_burst = r["at"], r["n_burst"]
    outcomes = [o for _, _, o in r["timeline"]]
    assert outcomes[0] == "promoted" and "rejected" in outcomes
    after = slice(at + n_burst, at + n_burst + 10)          # the 10 clean batches after the burst
    assert np.nanmean(r["promoted"][after]) > np.nanmean(r["latest"][after]) + 1.0
    assert any(ln.startswith("mean lpd served") for ln in lines)
