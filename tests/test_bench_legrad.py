"""The measures of ``bench/legrad.py`` (seed 001's running-window variance, paired ratios) and its
smallest setting."""
from __future__ import annotations

import importlib.util
import math
import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def legrad():
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    try:
        spec = importlib.util.spec_from_file_location("bench_legrad", os.path.join(ROOT, "bench", "legrad.py"))
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.path.remove(os.path.join(ROOT, "bench"))


def test_window_var_recovers_the_variance_of_a_stationary_stream(legrad):
    # i.i.d. N(3, 2.5²): every window of 10 has E[s²] = 6.25 and sd(s²) = 6.25·sqrt(2/9) ≈ 2.9; the mean
    # over 20,000 windows (overlapping: ~2,000 independent) has se ≈ 0.07, so ±0.3 is > 4 se
    rng = np.random.default_rng(0)
    x = 3.0 + 2.5 * rng.standard_normal(20_009)
    v = legrad.window_var(x, 10)
    assert v.shape == (20_000,)
    assert abs(v.mean() - 6.25) < 0.3
    # row j is exactly the sample variance (ddof 1) of iterations j..j+9; columns of a 2-D stream separately
    assert v[123] == pytest.approx(np.var(x[123:133], ddof=1), rel=1e-12)
    X = np.column_stack([x, 2 * x])
    assert np.allclose(legrad.window_var(X, 10), np.column_stack([v, 4 * v]))


def test_window_var_follows_a_changing_variance(legrad):
    # the variance drops from 100 to 1 half way; the windows after the change see 1 (±0.15: mean of 990
    # windows of a chi²_9/9 with ~100 independent ones, se ≈ 0.05)
    rng = np.random.default_rng(1)
    x = np.concatenate([10 * rng.standard_normal(1000), rng.standard_normal(1000)])
    v = legrad.window_var(x, 10)
    assert abs(v[1000:].mean() - 1.0) < 0.15
    assert abs(v[:990].mean() / 100 - 1.0) < 0.15


def test_window_var_rejects_a_short_stream(legrad):
    with pytest.raises(ValueError, match="T >= w"):
        legrad.window_var(np.zeros(5), 10)


def test_paired_ratio_and_its_standard_error(legrad):
    # two estimators sharing their noise: b = a + independent noise of variance 1, Var a = 4: the variance
    # ratio is 5/4; over 400 repetitions of 200 draws the delta-method se matches the spread of R to 25 %
    rng = np.random.default_rng(2)
    Rs, ses = [], []
    for _ in range(400):
        a = 2.0 * rng.standard_normal(200)
        b = a + rng.standard_normal(200)
        da, db = (b - b.mean()) ** 2 * 200 / 199, (a - a.mean()) ** 2 * 200 / 199
        r, se = legrad.paired_ratio(da, db)
        Rs.append(r)
        ses.append(se)
    assert abs(np.mean(Rs) - 1.25) < 0.02
    assert np.mean(ses) == pytest.approx(np.std(Rs), rel=0.25)
    # a reference with variance 0 (LeGrad's exact log σ gradient) gives inf, not a huge number
    assert math.isinf(legrad.paired_ratio(np.ones(10), np.zeros(10))[0])
    assert legrad.fmt_ratio(*legrad.paired_ratio(np.full(10, 1e-30), np.full(10, 1e-30))) == "both 0"
    assert legrad.fmt_ratio(1.2345, 0.0123) == "1.234 ± 0.012"


def test_geo_ratio_of_windows(legrad):
    rng = np.random.default_rng(3)
    va = 9.0 * rng.chisquare(9, 300) / 9
    vb = rng.chisquare(9, 300) / 9
    r, se = legrad.geo_ratio(va, vb)
    assert abs(r - 9.0) < 4 * se and se < 1.5


def test_smallest_bench_setting_runs(legrad, tmp_path, capsys):
    rc = legrad.main(["--only", "gauss,sbn", "--gauss-steps", "40", "--gauss-draws", "20",
                      "--sbn-steps", "4", "--sbn-ld-steps", "2", "--sbn-hidden", "8", "--sbn-per-class", "3",
                      "--results", str(tmp_path), "--img", str(tmp_path / "img")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "paired variance ratios" in out and "held-out, at the end" in out
    assert "f = log p(w) - log q(w)" in out and "f = log p(w), entropy exact" in out
    text = (tmp_path / "legrad_gauss.md").read_text()
    assert "Command: `python bench/legrad.py --only gauss" in text and "mu_1" in text
    assert (tmp_path / "legrad_sbn.md").exists()
    assert (tmp_path / "img" / "legrad_gauss_window.png").stat().st_size > 0
    assert (tmp_path / "img" / "legrad_sbn.png").stat().st_size > 0


def test_only_rejects_an_unknown_experiment(legrad):
    with pytest.raises(SystemExit):
        legrad.main(["--only", "gauss,nope"])
