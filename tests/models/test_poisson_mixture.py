"""The Poisson mixture (streamsvi/models/poisson_mixture.py).

The shared checks (tests/models/test_checks.py, case ``poisson_mixture``, picked up from the
class) cover: batch VI's ELBO never decreases; ρ = 1 on the full batch is one CAVI sweep of the
model's own primitives, bit for bit; SVI+ with M = |S| is SVI; same seed, same bits; additive
statistics; snapshots round-trip and resume; λ stays in its domain under strong SVI+ noise; the
gradient-variance estimate; the global ELBO is −Σ block KL; every annealing kind. Here: the
updates and the ELBO against formulas written out independently of the model's code, recovery
of planted rates by SVI, the predictive density against Monte Carlo, the refusals, and the
example config through the CLI on the embedded broker.
"""
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from scipy import stats
from scipy.optimize import linear_sum_assignment
from scipy.special import digamma, gammaln, logsumexp

from streamsvi.inference import SVI, Constant, RobbinsMonro, batch_vi
from streamsvi.inference.annealing import supported_kinds
from streamsvi.models import CONFIG_KINDS, MODELS, NatParams, PoissonMixture
from streamsvi.models.poisson_mixture import sample_mixture
from streamsvi.service.tomlw import dump_toml
from tests.conftest_broker import kafka_broker, new_group, new_topic  # noqa: F401  (fixtures)

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "poisson_mixture.toml"


def _random_lam(rng, K, D):
    """An arbitrary λ inside the domain (not a fixed point of anything)."""
    return NatParams(alpha=rng.uniform(0.5, 30.0, K), theta_shape=rng.uniform(0.5, 50.0, (K, D)),
                     theta_rate=rng.uniform(0.5, 10.0, (K, D)))


def _cavi_by_hand(x, alpha, a, b, alpha0, a0, b0):
    """One batch coordinate-ascent step, from the formulas (not the model's code).

    r_nk ∝ exp(ψ(α_k) − ψ(Σα) + Σ_d [x_nd (ψ(a_kd) − log b_kd) − a_kd / b_kd])
    α' = α0 + Σ_n r_nk,   a'_kd = a0_d + Σ_n r_nk x_nd,   b'_kd = b0_d + Σ_n r_nk
    """
    K = len(alpha)
    logit = np.empty((len(x), K))
    for k in range(K):
        logit[:, k] = (digamma(alpha[k]) - digamma(alpha.sum())
                       + np.sum(x * (digamma(a[k]) - np.log(b[k])) - a[k] / b[k], axis=1))
    r = np.exp(logit - logsumexp(logit, axis=1, keepdims=True))
    nk = r.sum(axis=0)
    return r, alpha0 + nk, a0 + r.T @ x, b0 + nk[:, None] * np.ones_like(a)


def _elbo_by_hand(x, alpha, a, b, alpha0, a0, b0):
    """The full-data ELBO at λ with the optimal q(z), term by term from scipy's densities:
    E_q[log p(x, z, π, θ)] + H[q(z)] + H[q(π)] + H[q(θ)]."""
    r = _cavi_by_hand(x, alpha, a, b, alpha0, a0, b0)[0]
    e_log_pi = digamma(alpha) - digamma(alpha.sum())
    e_log_th, e_th = digamma(a) - np.log(b), a / b
    log_p_pi = gammaln(alpha0.sum()) - gammaln(alpha0).sum() + np.sum((alpha0 - 1) * e_log_pi)
    log_p_th = np.sum(a0 * np.log(b0) - gammaln(a0) + (a0 - 1) * e_log_th - b0 * e_th)
    log_p_z = np.sum(r * e_log_pi)
    log_p_x = np.sum(r * (x @ e_log_th.T - e_th.sum(axis=1))) - gammaln(x + 1).sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        h_z = -np.sum(np.where(r > 0, r * np.log(r), 0.0))
    h_pi = stats.dirichlet(alpha).entropy()
    h_th = np.sum(stats.gamma(a, scale=1.0 / b).entropy())
    return log_p_pi + log_p_th + log_p_z + log_p_x + h_z + h_pi + h_th


# ------------------------------------------------------------------ the registry
def test_registered_from_its_class_alone():
    assert MODELS["poisson_mixture"] is PoissonMixture and CONFIG_KINDS["poisson_mixture"] is PoissonMixture
    assert PoissonMixture.record_kind == "dense"
    assert supported_kinds(PoissonMixture(2, 3)) == ("none", "svi+", "deterministic", "stochastic")
    model = PoissonMixture(4, 6)
    lam = model.init_params(np.random.default_rng(0), sample_mixture(50, rates=np.ones((4, 6)))[0], 50)
    size = sum(v.size for v in lam.values())
    assert PoissonMixture.param_size(model.check_settings(model.get_params())) == size == 4 + 2 * 4 * 6


# ------------------------------------------------------------------ (1) the closed-form step
@pytest.mark.parametrize("seed", [0, 1])
def test_rho_one_on_all_data_is_batch_cavi_from_the_formulas(seed):
    """The engine's step with ρ = 1 and N = |x| equals one CAVI step computed here (rtol 1e-10),
    from an arbitrary λ and a prior with per-component and per-feature values; with ρ = 0.3 it is
    the blend 0.7 λ + 0.3 λ̂."""
    rng = np.random.default_rng(seed)
    K, D = 3, 4
    x, _, _ = sample_mixture(250, rates=rng.uniform(0.5, 15.0, (K, D)), weights=np.ones(K), seed=seed)
    alpha0, a0, b0 = np.array([0.5, 1.0, 2.0]), np.array([1.0, 0.5, 2.0, 1.5]), np.array([0.1, 0.3, 1.0, 0.2])
    model = PoissonMixture(K, D, weight_concentration=alpha0.tolist(), prior_shape=a0.tolist(),
                           prior_rate=b0.tolist())
    lam = _random_lam(rng, K, D)
    r, alpha, a, b = _cavi_by_hand(x, lam["alpha"], lam["theta_shape"], lam["theta_rate"], alpha0, a0, b0)
    engine = SVI(model, n_total=len(x), schedule=Constant(1.0))
    new, info = engine.update(engine.state_from_params(lam), x)
    np.testing.assert_allclose(model.responsibilities(lam, x), r, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(new.lam["alpha"], alpha, rtol=1e-10)
    np.testing.assert_allclose(new.lam["theta_shape"], a, rtol=1e-10)
    np.testing.assert_allclose(new.lam["theta_rate"], b, rtol=1e-10)
    assert info.elbo == pytest.approx(_elbo_by_hand(x, lam["alpha"], lam["theta_shape"], lam["theta_rate"],
                                                    alpha0, a0, b0), rel=1e-10)
    engine = SVI(model, n_total=len(x), schedule=Constant(0.3))
    new, _ = engine.update(engine.state_from_params(lam), x)
    np.testing.assert_allclose(new.lam["theta_shape"], 0.7 * lam["theta_shape"] + 0.3 * a, rtol=1e-10)


def test_minibatch_target_scales_the_statistics_by_n_over_s():
    """λ̂ = η + (N/|S|) Σ_{n∈S} t_n: with N = 10 |S| the statistics of the by-hand step count ten times."""
    rng = np.random.default_rng(3)
    x, _, _ = sample_mixture(120, seed=3)
    model = PoissonMixture(3, 5, weight_concentration=1.0, prior_shape=1.0, prior_rate=0.1)
    lam = _random_lam(rng, 3, 5)
    r, *_ = _cavi_by_hand(x, lam["alpha"], lam["theta_shape"], lam["theta_rate"], np.ones(3), np.ones(5),
                          np.full(5, 0.1))
    engine = SVI(model, n_total=10 * len(x), schedule=Constant(1.0))
    new, _ = engine.update(engine.state_from_params(lam), x)
    np.testing.assert_allclose(new.lam["theta_shape"], 1.0 + 10 * r.T @ x, rtol=1e-10)
    np.testing.assert_allclose(new.lam["theta_rate"], 0.1 + 10 * r.sum(0)[:, None] + np.zeros((3, 5)), rtol=1e-10)


# ------------------------------------------------------------------ the ELBO
def test_elbo_matches_the_formulas_at_an_arbitrary_lambda():
    rng = np.random.default_rng(7)
    x, _, _ = sample_mixture(300, seed=7)
    model = PoissonMixture(3, 5, weight_concentration=0.7, prior_shape=2.0, prior_rate=0.5)
    lam = _random_lam(rng, 3, 5)
    want = _elbo_by_hand(x, lam["alpha"], lam["theta_shape"], lam["theta_rate"], np.full(3, 0.7),
                         np.full(5, 2.0), np.full(5, 0.5))
    assert batch_vi(model, len(x)).elbo(lam, x) == pytest.approx(want, rel=1e-10)


def test_one_component_elbo_is_the_exact_log_marginal_likelihood():
    """K = 1: after one CAVI step q(θ) is the exact Gamma posterior, so the ELBO equals
    log p(x) = Σ_d [a0 log b0 − log Γ(a0) + log Γ(a0 + Σx) − (a0 + Σx) log(b0 + n)] − Σ log x!
    (rel 1e-10): the constants of the local and global terms are all there."""
    x, _, _ = sample_mixture(80, rates=[[0.5, 3.0, 7.0]], seed=2)
    model = PoissonMixture(1, 3, prior_shape=[1.0, 2.0, 0.5], prior_rate=[0.2, 1.0, 0.1])
    a0, b0 = np.array([1.0, 2.0, 0.5]), np.array([0.2, 1.0, 0.1])
    lam = model.prior() + model.suffstats(model.local_step(model.prior(), x), x)
    s, n = x.sum(axis=0), len(x)
    log_ml = np.sum(a0 * np.log(b0) - gammaln(a0) + gammaln(a0 + s) - (a0 + s) * np.log(b0 + n)) \
        - gammaln(x + 1).sum()
    assert batch_vi(model, n).elbo(lam, x) == pytest.approx(log_ml, rel=1e-10)


# ------------------------------------------------------------------ (2) recovery and monotone batch VI
def _match(est, true):
    """The permutation of the estimated components closest to the true ones (L1 of the rates)."""
    rows, cols = linear_sum_assignment(np.abs(est[:, None, :] - true[None]).sum(axis=2))
    perm = np.empty(len(rows), dtype=int)
    perm[rows] = cols
    return rows, cols, perm


@pytest.mark.parametrize("seed", [0, 2, 5])
def test_svi_recovers_planted_rates(seed):
    """K = 3, D = 5, 3,000 records, rates 1..20: SVI (|S| = 200, ρ_t = (1 + t)^−0.7, 300 steps =
    20 passes) from the start on the first 400 records. After matching the components: every
    E[θ_kd] within 15 % of the true rate (seeds 0–7 gave at most 9 %), every E[π_k] within 0.03 of
    the true weight, and every record assigned to its own component."""
    x, z, rates = sample_mixture(3000, seed=1)
    model = PoissonMixture(3, 5)
    engine = SVI(model, n_total=len(x), schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    state, _ = engine.fit(engine.init(x[:400], seed=seed), x, n_steps=300, batch_size=200)
    est = model.rates(state.lam)
    rows, cols, perm = _match(est, rates)
    rel = np.abs(est[rows] - rates[cols]) / rates[cols]
    assert rel.max() <= 0.15, rel
    np.testing.assert_allclose(model.weights(state.lam)[rows], np.array([0.5, 0.3, 0.2])[cols], atol=0.03)
    assert np.mean(perm[model.predict(state.lam, x)] == z) >= 0.99


def test_batch_vi_elbo_increases_monotonically():
    """Batch VI from random soft responsibilities on the same 3,000 records: the full-data ELBO
    never decreases (to 1e-8 relative) over 60 sweeps, gains more than 5 nats per record (9.7 measured) and ends
    at the planted rates (within 10 %)."""
    x, _, rates = sample_mixture(3000, seed=1)
    model = PoissonMixture(3, 5, init="random_resp", n_init=1, init_sweeps=0)
    engine = batch_vi(model, len(x))
    state, infos = engine.fit(engine.init(x, seed=0), x, n_steps=60)
    elbo = np.array([i.elbo for i in infos] + [engine.elbo(state.lam, x)])
    assert np.all(np.diff(elbo) >= -1e-8 * np.abs(elbo[1:])), np.diff(elbo).min()
    assert elbo[-1] - elbo[0] > 5 * len(x)
    est = model.rates(state.lam)
    rows, cols, _ = _match(est, rates)
    assert np.max(np.abs(est[rows] - rates[cols]) / rates[cols]) <= 0.10


# ------------------------------------------------------------------ scoring
def test_predictive_density_matches_monte_carlo():
    """log Σ_k E[π_k] Π_d NB(x_d) against E_q[Σ_k π_k Π_d Poisson(x_d | θ_kd)] from 40,000 draws of
    q (numpy's Dirichlet and Gamma samplers), within 5 standard errors."""
    rng = np.random.default_rng(11)
    model = PoissonMixture(3, 4)
    lam = NatParams(alpha=np.array([2.0, 5.0, 3.0]), theta_shape=rng.uniform(2.0, 20.0, (3, 4)),
                    theta_rate=rng.uniform(1.0, 4.0, (3, 4)))
    x = np.array([[0, 1, 2, 3], [5, 0, 1, 9], [2, 2, 2, 2]], dtype=float)
    S = 40_000
    pis = rng.dirichlet(lam["alpha"], size=S)
    th = rng.gamma(lam["theta_shape"], 1.0 / lam["theta_rate"], size=(S, 3, 4))
    dens = np.einsum("sk,nsk->ns", pis, np.exp(stats.poisson.logpmf(x[:, None, None, :], th[None]).sum(-1)))
    mean, se = dens.mean(axis=1), dens.std(axis=1, ddof=1) / np.sqrt(S)
    got = np.exp(model.predictive_logpdf(lam, x))
    assert np.all(np.abs(got - mean) <= 5 * se), (got, mean, se)
    # and exactly: each count's predictive is scipy's negative binomial NB(a, b / (b + 1)) (rel 1e-10)
    w = lam["alpha"] / lam["alpha"].sum()
    a, b = lam["theta_shape"], lam["theta_rate"]
    nb = stats.nbinom.logpmf(x[:, None, :], a[None], (b / (b + 1))[None])
    np.testing.assert_allclose(model.predictive_logpdf(lam, x), logsumexp(nb.sum(-1) + np.log(w), axis=1), rtol=1e-10)


def test_mixture_views():
    model = PoissonMixture(2, 3)
    lam = NatParams(alpha=np.array([1.0, 3.0]), theta_shape=np.array([[2.0, 4.0, 6.0], [1.0, 1.0, 1.0]]),
                    theta_rate=np.full((2, 3), 2.0))
    np.testing.assert_allclose(model.weights(lam), [0.25, 0.75])
    np.testing.assert_allclose(model.means(lam), [[1.0, 2.0, 3.0], [0.5, 0.5, 0.5]])
    np.testing.assert_allclose(model.covariances(lam)[0], np.diag([1.0, 2.0, 3.0]))


# ------------------------------------------------------------------ refusals
@pytest.mark.parametrize("bad, what", [(-1.0, "-1.0"), (2.5, "2.5")])
def test_refuses_negative_and_fractional_counts(bad, what):
    with pytest.raises(ValueError, match=rf"counts must be integers >= 0; got \[\[1.0, {what}\]\] at records \[1\]"):
        PoissonMixture(2, 2).check_batch([[1.0, 2.0], [1.0, bad]])
    with pytest.raises(ValueError, match=r"non-finite values in records \[0\]"):
        PoissonMixture(2, 2).check_batch([[np.nan, 2.0]])


@pytest.mark.parametrize("kw, msg", [({"n_components": 0}, "n_components must be an integer >= 1, got 0"),
                                     ({"prior_rate": -1}, "prior_rate must be a finite number > 0 or a list"),
                                     ({"weight_concentration": [1.0, 2.0]},
                                      r"weight_concentration must be a number or 3 numbers"),
                                     ({"prior_shape": [1.0]}, r"prior_shape must be a number or 2 numbers"),
                                     ({"init": "kmeans++"}, "init must be one of 'kmeans', 'random_from_data'")])
def test_refuses_bad_settings(kw, msg):
    with pytest.raises(ValueError, match=msg):
        PoissonMixture(**{"n_components": 3, "n_features": 2, **kw})


# ------------------------------------------------------------------ the example config
def test_example_config_validates_and_builds():
    out = subprocess.run([sys.executable, "-m", "streamsvi", "run", "--config", str(CONFIG), "--print-config"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert cfg["model"] == {"kind": "poisson_mixture", "n_components": 3, "n_features": 5,
                            "weight_concentration": 1.0, "prior_shape": 1.0, "prior_rate": 0.1,
                            "init": "kmeans", "n_init": 3, "init_sweeps": 5, "init_batches": 4}


def test_example_config_runs_end_to_end_on_the_embedded_broker(kafka_broker, new_topic, new_group, tmp_path):
    """configs/poisson_mixture.toml as it is, with only the broker, topic, group, checkpoint directory
    and metrics port changed: 3,000 JSON records on a topic, ``streamsvi run --until-drained``, then
    the snapshot: the planted rates within 15 %, and ``streamsvi inspect`` shows the components."""
    cfg = tomllib.loads(CONFIG.read_text())
    topic = new_topic()
    cfg["source"].update(bootstrap_servers=kafka_broker.bootstrap, topics=[topic], group_id=new_group(),
                         dead_letter_topic=f"{topic}-dead")
    cfg["checkpoint"]["directory"] = str(tmp_path / "ck")
    cfg["metrics"]["port"] = 0
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    x, _, rates = sample_mixture(3000, seed=1)
    from kafka import KafkaProducer
    producer = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", linger_ms=5)
    for row in x.astype(int).tolist():
        producer.send(topic, json.dumps(row).encode())
    producer.flush(timeout=30)
    producer.close()
    streamsvi = str(Path(sys.executable).with_name("streamsvi"))
    proc = subprocess.run([streamsvi, "run", "--config", str(tmp_path / "c.toml"), "--until-drained"],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from streamsvi import load
    fitted = load(tmp_path / "ck", follow="latest")      # the run's last snapshot (promotion pending)
    assert fitted.records_seen == 3000 - cfg["metrics"].get("heldout_size", 0)   # prequential: none withheld
    est = fitted.model.rates(fitted.lam)
    rows, cols, _ = _match(est, rates)
    assert np.max(np.abs(est[rows] - rates[cols]) / rates[cols]) <= 0.15
    assert fitted.score(x[:2])[0]["assignment"] in range(3)
    info = subprocess.run([streamsvi, "inspect", str(tmp_path / "ck")], capture_output=True, text=True, timeout=60)
    assert info.returncode == 0 and "weights" in info.stdout, info.stderr


# ------------------------------------------------------------------ the seam the dense kind lacks
def test_a_negative_count_in_the_stream_is_dead_lettered(tmp_path):
    """The model's own check (a count must be an integer >= 0) dead-letters the record as
    ``model_check`` (streamsvi.io.validate.ModelChecked); it used to reach the update, which
    refused the whole batch with exit 2 at every restart."""
    from streamsvi.service.config import validate
    from streamsvi.service.daemon import Daemon
    import io

    x, _, _ = sample_mixture(300, seed=2)
    rows = x.astype(int).tolist()
    rows[150][1] = -2
    (tmp_path / "d.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    cfg = validate({"model": {"kind": "poisson_mixture", "n_components": 3, "n_features": 5},
                    "inference": {"n_total": 300, "batch_size": 50},
                    "source": {"kind": "file", "path": str(tmp_path / "d.jsonl"), "format": "jsonl"},
                    "checkpoint": {"directory": str(tmp_path / "ck")},
                    "metrics": {"enabled": False, "heldout_size": 0}})
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=60)
    assert res.dead == 1 and res.records == 299
