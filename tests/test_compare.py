"""``streamsvi compare --config FILE --data RECORDS`` (streamsvi/compare.py) for every model kind.

Each case writes a small seeded records file in the record format the daemon
reads (JSON lines in the config's codec, made by ``streamsvi.io.inputs.sample_records``:
river's bundled Phishing and ImageSegments for the labelled models, synthetic
records for the others), and runs the comparison with tiny settings.
"""
import math
import os

import numpy as np
import pytest

from streamsvi import compare as cmp
from streamsvi.cli import main
from streamsvi.io.inputs import sample_records
from streamsvi.io.produce import write_records
from streamsvi.io.records import record_kind
from streamsvi.models import CONFIG_KINDS, GradientModel, PoissonMixture
from streamsvi.service.config import build_model, load_config

#: model.kind -> (its [model] table beyond kind, records, |S|, labelled records kept)
CASES = {
    "gmm": ({"n_components": 3, "n_features": 2}, 240, 40),
    "gmm_dp": ({"n_components": 5, "n_features": 2}, 240, 40),
    "gauss1d": ({"n_components": 2}, 200, 40),
    "hmm": ({"n_components": 3, "n_symbols": 4}, 80, 20),
    "lda": ({"n_components": 3, "n_features": 30}, 80, 20),
    "pmf": ({"n_factors": 2}, 600, 100),
    "hpf": ({"n_factors": 2}, 600, 100),
    "poisson_mixture": ({"n_components": 2, "n_features": 3}, 200, 40),
    "logistic": ({"n_features": 9}, 300, 50),                   # river's Phishing (9 features)
    "softmax": ({"n_features": 18, "n_classes": 7}, 300, 50),   # river's ImageSegments (18 features)
}


def write_config(tmp_path, kind, batch_size=None, extra_inference=""):
    table, _, S = CASES[kind]
    lines = ["[model]", f'kind = "{kind}"'] + [f"{k} = {v}" for k, v in table.items()]
    lines += ["[inference]", "n_total = 1000", f"batch_size = {batch_size or S}", "tau0 = 1.0", "kappa = 0.7"]
    if kind in ("logistic", "softmax"):
        lines.append("n_samples = 4")          # ldgrad's default P*K samples is slow for a unit test
    lines += [extra_inference, "[source]", 'topics = ["t"]', "[checkpoint]", f'directory = "{tmp_path / "ck"}"']
    path = tmp_path / f"{kind}.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def write_records_file(tmp_path, kind, config_path, seed=1):
    cfg = load_config(config_path)
    model = build_model(cfg["model"])
    rk = record_kind(model)
    _, n, _ = CASES[kind]
    recs = sample_records(rk.name, model, counts=isinstance(model, PoissonMixture), n=n, seed=seed)
    part = recs.part
    if rk.n_records(part) > n:                                  # river's sets come whole: a seeded subset
        keep = np.sort(np.random.default_rng(seed).choice(rk.n_records(part), n, replace=False))
        part = rk.take(part, keep)
    path = tmp_path / f"{kind}.jsonl"
    write_records(path, part, rk.make_codec("json", model, {**cfg["source"], **cfg["records"]}), rk)
    return path


def test_every_config_kind_has_a_case():
    """A model kind added to the registry must get a case here (and so be compared)."""
    assert set(CASES) == set(CONFIG_KINDS)


@pytest.mark.parametrize("kind", sorted(CASES))
def test_compare_runs_every_model(tmp_path, kind):
    conf = write_config(tmp_path, kind)
    data = write_records_file(tmp_path, kind, conf)
    res = cmp.compare(conf, data, inits=3, epochs=2, seed=0)
    cls = CONFIG_KINDS[kind]
    expected = (list(cmp.ESTIMATORS) if issubclass(cls, GradientModel) else
                [f"svi+ M={CASES[kind][2] / 4:g}" if a == "svi+" else a for a in cls.annealing_kinds])
    assert [r.label for r in res.rows] == expected
    n = CASES[kind][1]
    assert res.n_held_out == round(0.1 * n) and res.n_train == n - res.n_held_out
    for r in res.rows:
        assert len(r.elbo) == len(r.held_out) == len(r.seconds) == 3
        assert all(math.isfinite(v) for v in r.elbo + r.held_out + r.seconds)
    for r in res.rows[1:]:
        assert r.wins + r.ties + r.losses == 3
        assert 0 < r.sign_p <= 1
    assert "(reference)" in cmp.format_table(res)


def test_same_seed_same_table_and_the_reference_is_plain_svi(tmp_path):
    """Seeded: two runs agree exactly; the ``none`` row is plain SVI from init(train, seed + 1)."""
    from streamsvi.inference import SVI, RobbinsMonro

    conf = write_config(tmp_path, "gmm")
    data = write_records_file(tmp_path, "gmm", conf)
    a = cmp.compare(conf, data, inits=2, epochs=3, annealers=["none", "deterministic"], seed=4)
    b = cmp.compare(conf, data, inits=2, epochs=3, annealers=["none", "deterministic"], seed=4)
    assert [r.elbo for r in a.rows] == [r.elbo for r in b.rows]
    cfg = load_config(conf)
    model, kind, recs = cmp.read_records_file(cfg, data)
    train, test = cmp.split_held_out(kind, recs.part, 0.1, 4)
    N = len(train)
    eng = SVI(model, N, RobbinsMonro(1.0, 0.7))
    st, _ = eng.fit(eng.init(train, seed=4 + 1), train, n_steps=round(3 * N / 40), batch_size=40)
    assert a.rows[0].elbo[0] == pytest.approx(eng.elbo(st.lam, train) / N, rel=1e-12)


def test_ties_and_sign_test():
    assert cmp.sign_test(5, 0) == pytest.approx(0.0625)
    assert cmp.sign_test(3, 3) == 1.0
    assert cmp.sign_test(0, 0) == 1.0


def test_the_cli_prints_one_row_per_method(tmp_path, capsys):
    conf = write_config(tmp_path, "lda")
    data = write_records_file(tmp_path, "lda", conf)
    rc = main(["compare", "--config", str(conf), "--data", str(data), "--inits", "2", "--epochs", "2",
               "--annealers", "none,svi+", "--m", "5", "10"])
    out, err = capsys.readouterr()
    assert rc == 0
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("none ", "svi+ "))]
    assert [r[0] for r in rows] == ["none", "svi+", "svi+"] and [rows[1][1], rows[2][1]] == ["M=5", "M=10"]
    assert "held-out bound/word" in out and "W/T/L vs none" in out
    for r in rows[1:]:
        w, t, l = map(int, r[-2].split("/"))
        assert w + t + l == 2
    assert "start 2/2" in err                  # progress on stderr


def test_gradient_path_estimators_from_the_cli(tmp_path, capsys):
    conf = write_config(tmp_path, "logistic")
    data = write_records_file(tmp_path, "logistic", conf)
    rc = main(["compare", "--config", str(conf), "--data", str(data), "--inits", "2", "--epochs", "1",
               "--estimators", "legrad,regrad", "--held-out", "0.2"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "held-out log p(y|x)" in out and "240 train / 60 held-out" in out
    assert [ln.split()[0] for ln in out.splitlines() if ln.startswith(("legrad", "regrad"))] == ["legrad", "regrad"]


@pytest.mark.parametrize("kind, flags, message", [
    ("lda", ["--estimators", "legrad"], "--estimators applies to the gradient path"),
    ("logistic", ["--annealers", "none,svi+"], "--annealers applies to the conjugate models"),
    ("softmax", ["--m", "10"], "--m applies to the conjugate models"),
    ("logistic", ["--full-batch"], "--full-batch applies to the conjugate models"),
    ("pmf", ["--annealers", "none,deterministic"], "deterministic not defined for model.kind = 'pmf'"),
    ("gmm", ["--components", "3"], "--components is the demo's"),
    ("gmm", ["--held-out", "1.5"], "--held-out must be in [0, 1)"),
])
def test_a_flag_the_model_does_not_take_is_exit_2(tmp_path, capsys, kind, flags, message):
    conf = write_config(tmp_path, kind)
    data = write_records_file(tmp_path, kind, conf)
    assert main(["compare", "--config", str(conf), "--data", str(data), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamsvi: error: ") and message in err


def test_demo_only_and_config_only_flags(capsys):
    assert main(["compare", "--estimators", "legrad"]) == 2
    assert "--estimators needs --config FILE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--estimators", "legrad,simulated"])
    assert exc.value.code == 2 and "simulated unknown" in capsys.readouterr().err


def test_config_needs_data(tmp_path, capsys):
    conf = write_config(tmp_path, "gmm")
    assert main(["compare", "--config", str(conf)]) == 2
    assert "--config needs --data RECORDS" in capsys.readouterr().err


@pytest.mark.parametrize("kind, line, bad, message", [
    ("gmm", 3, "[1.0, ", "line 3: "),
    ("gmm", 4, "[1.0, 2.0, 3.0]", "line 4: "),                   # 3 numbers, the model takes 2
    ("lda", 2, '{"ids": [1, 99], "counts": [1, 2]}', "line 2: "),   # word id beyond V = 30
    ("hmm", 5, '"ACGT"', "line 5: "),
    ("logistic", 2, '{"x": [1, 2, 3, 4, 5, 6, 7, 8, 9], "y": 7}', "line 2: "),  # label 7: binary model
])
def test_a_malformed_records_file_names_the_line(tmp_path, capsys, kind, line, bad, message):
    conf = write_config(tmp_path, kind)
    data = write_records_file(tmp_path, kind, conf)
    lines = data.read_text().splitlines()
    lines[line - 1] = bad
    data.write_text("\n".join(lines) + "\n")
    assert main(["compare", "--config", str(conf), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert f"{data}, {message}" in err, err
    assert "Traceback" not in err


def test_missing_and_empty_records_files(tmp_path, capsys):
    conf = write_config(tmp_path, "gmm")
    assert main(["compare", "--config", str(conf), "--data", str(tmp_path / "none.jsonl")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("\n\n")
    assert main(["compare", "--config", str(conf), "--data", str(tmp_path / "empty.jsonl")]) == 2
    assert "no records" in capsys.readouterr().err


def test_native_file_formats(tmp_path):
    """The record kind's usual file (here CSV rows and sequences) reads like its JSON lines."""
    conf = write_config(tmp_path, "gmm")
    data = write_records_file(tmp_path, "gmm", conf)
    cfg = load_config(conf)
    _, _, js = cmp.read_records_file(cfg, data)
    csv = tmp_path / "gmm.csv"
    csv.write_text("".join(",".join(repr(float(v)) for v in row) + "\n" for row in js.part))
    _, _, nat = cmp.read_records_file(cfg, csv)
    np.testing.assert_array_equal(nat.part, js.part)
    csv.write_text("1.0,2.0\n1.0,x\n")
    with pytest.raises(ValueError, match=r"gmm.csv, line 2: 'x' is not a number"):
        cmp.read_records_file(cfg, csv)


def test_no_held_out(tmp_path):
    conf = write_config(tmp_path, "gauss1d")
    data = write_records_file(tmp_path, "gauss1d", conf)
    res = cmp.compare(conf, data, inits=2, epochs=1, held_out=0.0, annealers=["none"])
    assert res.n_held_out == 0 and res.rows[0].held_out == []
    assert len(res.rows[0].elbo) == 2


def test_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    conf = write_config(tmp_path, "poisson_mixture")
    data = write_records_file(tmp_path, "poisson_mixture", conf)
    png = tmp_path / "trace.png"
    assert main(["compare", "--config", str(conf), "--data", str(data), "--inits", "2", "--epochs", "2",
                 "--annealers", "none,stochastic", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    res = cmp.compare(conf, data, inits=1, epochs=2, annealers=["none"], trace=True)
    tr = res.rows[0].traces[0]
    assert len(tr) == min(cmp.SEGMENTS, round(2 * 180 / 40)) + 1 and tr[0][0] == 0.0
    assert tr[-1][1] == pytest.approx(res.rows[0].elbo[0])


# ------------------------------------------------------------------ real data (cached or fetched)
def _real(load):
    try:
        return load()
    except FileNotFoundError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"data unavailable: {exc}")


def test_lda_on_real_nyt_documents(tmp_path):
    """200 NYT documents (seed 002's corpus) as JSON lines: every row finite, SVI improves on its start."""
    from streamsvi import datasets

    X, _ = _real(datasets.load_nyt)
    conf = tmp_path / "lda.toml"
    conf.write_text(f'[model]\nkind = "lda"\nn_components = 5\nn_features = 3012\n[inference]\nn_total = 1000\n'
                    f'batch_size = 30\ntau0 = 10.0\nkappa = 0.7\n[source]\ntopics = ["t"]\n'
                    f'[checkpoint]\ndirectory = "{tmp_path}"\n')
    cfg = load_config(conf)
    model = build_model(cfg["model"])
    rk = record_kind(model)
    data = tmp_path / "nyt.jsonl"
    write_records(data, X[:200], rk.make_codec("json", model, cfg["source"]), rk)
    res = cmp.compare(conf, data, inits=2, epochs=2, annealers=["none", "svi+"])
    assert res.n_train == 180 and res.held_out_name == "held-out bound/word"
    for r in res.rows:
        assert all(math.isfinite(v) for v in r.elbo + r.held_out)
        assert all(-9.0 < v < -5.0 for v in r.held_out)        # per-word bound over 3012 words: log 3012 = 8.0


def test_the_configs_own_annealers_are_used(tmp_path, capsys):
    """[inference.annealing] of a kind gives that kind's row its settings (a growing M for svi+); a
    schedule that has not finished by the last step is said on stderr."""
    conf = write_config(tmp_path, "gmm", extra_inference='[inference.annealing]\nkind = "svi+"\nM0 = 10\n'
                                                          'schedule = "linear"\nincrement = 2')
    data = write_records_file(tmp_path, "gmm", conf)
    res = cmp.compare(conf, data, inits=1, epochs=1, annealers=["none", "svi+"])
    assert [r.label for r in res.rows] == ["none", "svi+ M=10 linear"]
    msgs = []
    cmp.compare(conf, data, inits=1, epochs=1, annealers=["none", "deterministic"], progress=msgs.append)
    assert any(m.startswith("note: deterministic: the temperature is T = ") for m in msgs)
    msgs.clear()
    cmp.compare(conf, data, inits=1, epochs=20, annealers=["none", "deterministic"], progress=msgs.append)
    assert not any(m.startswith("note:") for m in msgs)          # 20 epochs: 108 steps > n_steps = 100


def test_plot_without_matplotlib_is_a_clear_error_before_any_run(tmp_path, capsys, monkeypatch):
    import sys

    conf = write_config(tmp_path, "gauss1d")
    data = write_records_file(tmp_path, "gauss1d", conf)
    monkeypatch.setitem(sys.modules, "matplotlib", None)          # import matplotlib -> ImportError
    assert main(["compare", "--config", str(conf), "--data", str(data), "--plot", str(tmp_path / "p.png")]) == 2
    err = capsys.readouterr().err
    assert "--plot needs matplotlib: pip install 'streamsvi[report]'" in err and "start 1/" not in err
    with pytest.raises(ImportError, match="--plot needs matplotlib"):
        cmp.plot_traces(cmp.Comparison([], "gauss1d", "", 1, 0, "", "", 1), tmp_path / "p.png")


def test_each_estimator_gets_its_own_defaults(tmp_path):
    """An estimator row is the config's engine with that estimator: settings the config leaves unset
    (here kl) take that estimator's default, settings it sets are kept."""
    from streamsvi.inference.gradients import GradientVI
    from streamsvi.service.config import build_engine

    conf = write_config(tmp_path, "logistic")
    cfg = load_config(conf)
    model = build_model(cfg["model"])
    sched = cmp._schedule(cfg["inference"], None, None)[0]
    engines = {label: eng for label, eng, _ in cmp._gradient_methods(cfg, model, 100, 10, list(cmp.ESTIMATORS),
                                                                     sched)}
    for est, eng in engines.items():
        alone = GradientVI(model, n_total=100.0, estimator=est, n_samples=4, schedule=sched)
        assert (eng.estimator, eng.kl, eng.n_samples) == (est, alone.kl, 4)
    cfg["inference"]["kl"] = "exact"
    assert all(e.kl == "exact" for _, e, _ in cmp._gradient_methods(cfg, model, 100, 10, ["legrad", "regrad"], sched))
    assert build_engine(cfg, 100.0, model=model).kl == "exact"


def test_full_batch_is_batch_vi(tmp_path):
    """--full-batch: the none row is batch VI (rho = 1 on the whole training set), ``epochs`` steps."""
    from streamsvi.inference import batch_vi

    conf = write_config(tmp_path, "poisson_mixture")
    data = write_records_file(tmp_path, "poisson_mixture", conf)
    res = cmp.compare(conf, data, inits=2, epochs=4, full_batch=True, annealers=["none", "svi+"], m=[50])
    assert "4 steps (full batch)" in res.settings and [r.label for r in res.rows] == ["none", "svi+ M=50"]
    model, kind, recs = cmp.read_records_file(load_config(conf), data)
    train, _ = cmp.split_held_out(kind, recs.part, 0.1, 0)
    eng = batch_vi(model, len(train))
    st, _ = eng.fit(eng.init(train, seed=1), train, n_steps=4)
    assert res.rows[0].elbo[0] == pytest.approx(eng.elbo(st.lam, train) / len(train), rel=1e-12)
