"""bench/gradient_f.py end to end on its smoke settings (the target at n = 20; no download)."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import gradient_f as bench  # noqa: E402  (bench/gradient_f.py)


def test_quick_run_prints_both_tables_with_every_row(capsys):
    assert bench.main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert "trace of the gradient's Monte Carlo variance" in out and "exact ELBO after" in out
    for cov in bench.COVS:
        for label, _, _ in bench.ESTS:
            assert any(cov in ln and label in ln and "×" in ln for ln in out.splitlines()), (cov, label)
    assert "nan" not in out.lower()
