"""bench/applier_ceiling.py end to end on its smallest sizes (synthetic data, no download, a few seconds)."""
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import applier_ceiling as bench  # noqa: E402  (bench/applier_ceiling.py)


def test_every_model_gets_a_finite_positive_row(capsys):
    rows = bench.main(["--tiny", "--min-time", "0.02", "--batches", "3", "--rounds", "2"])
    assert [r["model"] for r in rows] == list(bench.MODELS)
    for r in rows:
        for k in ("S", "bytes", "worker_us_per_record", "applier_deltas_s", "applier_records_s", "n_star"):
            assert math.isfinite(r[k]) and r[k] > 0, (r["model"], k, r[k])
        assert math.isclose(r["applier_records_s"], r["applier_deltas_s"] * r["S"])
    printed = capsys.readouterr().out
    assert all(m in printed for m in bench.MODELS) and "N*" in printed
