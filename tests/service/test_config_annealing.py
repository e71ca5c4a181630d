"""[inference.annealing] in the daemon config: validation, defaults, build_engine."""
import tomllib

import numpy as np
import pytest

from streamsvi.inference import SVI, load_state, save_state
from streamsvi.inference.annealing import Deterministic, NoAnnealing, Stochastic, SVIPlus
from streamsvi.models import BayesianGMM
from streamsvi.service.config import ConfigError, build_engine, validate

BASE = """
[model]
kind = "{kind}"
n_components = 3
n_features = 2
[inference]
n_total = 1000
batch_size = 100
{extra}
[source]
kind = "file"
path = "x.jsonl"
[checkpoint]
directory = "c"
"""


def _cfg(extra="", kind="gmm"):
    text = BASE.format(kind=kind, extra=extra)
    if kind == "pmf":
        text = text.replace("n_components = 3\nn_features = 2\n", "")
    return validate(tomllib.loads(text))


@pytest.mark.parametrize("table, expect", [
    ("", None),
    ('[inference.annealing]\nkind = "none"', NoAnnealing()),
    ('[inference.annealing]\nkind = "svi+"\nM0 = 10\nschedule = "linear"\nincrement = 2.5',
     SVIPlus(10.0, schedule="linear", increment=2.5)),
    ('[inference.annealing]\nkind = "deterministic"\nT0 = 3\nn_steps = 40',
     Deterministic(T0=3.0, n_steps=40)),
    ('[inference.annealing]\nkind = "stochastic"\nrho0 = 0.25\nschedule = "linear"\nn_steps = 50',
     Stochastic(rho0=0.25, schedule="linear", n_steps=50)),
])
def test_annealing_table_builds_the_annealer(table, expect):
    cfg = _cfg(table)
    engine = build_engine(cfg, 1000.0)
    assert engine.annealer == expect
    if expect is not None:   # the resolved config shows every setting, defaults filled
        assert cfg["inference"]["annealing"] == expect.to_dict()


def test_effective_batch_size_keeps_working():
    engine = build_engine(_cfg("effective_batch_size = 20"), 1000.0)
    assert engine.annealer is None and engine.annealing == SVIPlus(20.0)


@pytest.mark.parametrize("table, msg", [
    ('[inference.annealing]\nschedule = "linear"', r"inference.annealing.kind: required"),
    ('[inference.annealing]\nkind = "quantum"', r"inference.annealing.kind: expected one of none, svi\+"),
    ('[inference.annealing]\nkind = "deterministic"\nrho0 = 0.5',
     r"unknown setting\(s\) \['rho0'\] for kind = 'deterministic'; known: "
     r"\['T0', 'dirichlet', 'jitter', 'jitter_at', 'n_steps', 'rate', 'schedule'\]"),
    ('[inference.annealing]\nkind = "deterministic"\nT0 = "hot"', r"inference.annealing.T0: expected a finite number"),
    ('[inference.annealing]\nkind = "deterministic"\nT0 = 0.5', r"inference.annealing.T0: must be >= 1"),
    ('[inference.annealing]\nkind = "deterministic"\nrate = 1.0', r"rate must be in \(0, 1\)"),
    ('[inference.annealing]\nkind = "stochastic"\nn_steps = 2.5', r"inference.annealing.n_steps: expected an integer"),
    ('[inference.annealing]\nkind = "svi+"', r"exactly one of M0"),
    ('[inference.annealing]\nkind = "svi+"\nM0 = 500', r"inference.annealing.M0: must be in \(0, batch_size=100\]"),
    ('effective_batch_size = 20\n[inference.annealing]\nkind = "svi+"\nM0 = 20', r"not both"),
    ('annealing = "stochastic"', r"inference.annealing: expected a table"),
])
def test_bad_annealing_settings_are_clear_errors(table, msg):
    with pytest.raises(ConfigError, match=msg):
        _cfg(table)


@pytest.mark.parametrize("kind", ["deterministic", "stochastic"])
def test_pmf_refuses_tempering_annealers(kind):
    with pytest.raises(ConfigError, match=f"'{kind}' is not defined for model.kind = 'pmf'"):
        _cfg(f'[inference.annealing]\nkind = "{kind}"', kind="pmf")
    assert build_engine(_cfg('[inference.annealing]\nkind = "svi+"\nM0 = 10', kind="pmf"),
                        1000.0).annealer == SVIPlus(10.0)


def test_checkpoint_without_annealer_loads_as_before(tmp_path):
    """An engine without annealer writes the settings it wrote before annealers existed,
    and such a checkpoint loads as constant-M SVI+."""
    model = BayesianGMM(2, 2)
    X = np.random.default_rng(0).normal(size=(50, 2))
    engine = SVI(model, n_total=50, effective_batch_size=10)
    assert "annealer" not in engine.to_dict()
    save_state(tmp_path / "s.npz", engine, engine.init(X))
    engine2, _ = load_state(tmp_path / "s.npz")
    assert engine2.annealer is None and engine2.annealing == SVIPlus(10)


@pytest.mark.parametrize("kind, expect", [("deterministic", Deterministic(T0=3.0, n_steps=4)),
                                          ("stochastic", Stochastic(rho0=0.5, n_steps=4))])
def test_lda_takes_the_tempering_annealers(kind, expect):
    """lda declares all four kinds: the config builds the annealer, and the engine's updates
    run it on LDA's scaled-columns storage."""
    from streamsvi.datasets import make_lda_corpus

    table = {"deterministic": "T0 = 3\nn_steps = 4", "stochastic": "rho0 = 0.5\nn_steps = 4"}[kind]
    cfg = validate(tomllib.loads(BASE.format(kind="lda", extra=f'[inference.annealing]\nkind = "{kind}"\n'
                                             + table).replace("n_features = 2", "n_features = 200")))
    engine = build_engine(cfg, 1000.0)
    assert engine.annealer == expect
    X, _, _ = make_lda_corpus(120, n_topics=3, n_words=200, doc_length=20, seed=1)
    state = engine.init(X, seed=0)
    for t in range(1, 7):
        state, info = engine.update(state, X[20 * (t - 1):20 * t])
        assert (info.temperature, info.restart_weight) == (expect.temperature(t), expect.restart_weight(t))
        assert np.isfinite(info.elbo)
    assert engine.model.is_scaled(state.lam) and engine.model.in_domain(state.lam)


def test_the_variants_of_issue_29_are_config_settings():
    """detAVI's inverse schedule, α/T tempering and jitter, and stochAVI's document restart, from TOML."""
    cfg = _cfg('[inference.annealing]\nkind = "deterministic"\nT0 = 10\nschedule = "inverse"\n'
               'dirichlet = "concentration"\njitter = 0.01\njitter_at = "crossing"')
    eng = build_engine(cfg, 1000.0)
    assert eng.annealing == Deterministic(T0=10.0, schedule="inverse", dirichlet="concentration", jitter=0.01,
                                          jitter_at="crossing")
    assert eng.annealing.level(2) == pytest.approx(1 / (1 - 0.9 ** 2))       # seed 002's (1 − 0.9^t)^−1
    lda = _cfg('[inference.annealing]\nkind = "stochastic"\nlocal_restart = true', kind="lda")
    assert build_engine(lda, 1000.0).annealing == Stochastic(local_restart=True)
    with pytest.raises(ConfigError, match="dirichlet"):
        _cfg('[inference.annealing]\nkind = "deterministic"\ndirichlet = "alpha"')
    with pytest.raises(ConfigError, match="local_restart"):
        build_engine(_cfg('[inference.annealing]\nkind = "stochastic"\nlocal_restart = true'), 1000.0)
