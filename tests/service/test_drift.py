"""Drift that the learner answers (streamsvi.service.drift): the responses' ρ and annealing
sequences, the detector on synthetic lpd sequences, checkpoint round trips, config errors."""
import json
import tomllib
from types import SimpleNamespace

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.inference import SVI, load_state, save_state
from streamsvi.inference.annealing import Deterministic
from streamsvi.inference.schedules import Adjusted, RobbinsMonro
from streamsvi.models import BayesianGMM
from streamsvi.service.config import ConfigError, validate
from streamsvi.service.drift import DriftMonitor, Reannealed
from streamsvi.service.metrics import DaemonMetrics

BASE = RobbinsMonro(tau0=1.0, kappa=0.7)


def _data(seed=0, n=2000):
    rng = np.random.default_rng(seed)
    return np.concatenate([rng.normal(-3, 1, (n // 2, 2)), rng.normal(3, 1, (n // 2, 2))])[rng.permutation(n)]


def _engine(**kw):
    return SVI(BayesianGMM(2, 2), n_total=2000, schedule=BASE, **kw)


def _run(engine, monitor, state, X, steps, lpds=None, batch=50):
    """``steps`` updates; after each the monitor observes (lpd from ``lpds`` or nothing scored)."""
    rhos, temps = [], []
    for i in range(steps):
        j = (state.step * batch) % len(X)
        state, info = engine.update(state, X[j:j + batch])
        rhos.append(info.rho)
        temps.append(info.temperature)
        if monitor is not None:
            monitor.observe(state, None if lpds is None else lpds[i], 0 if lpds is None else batch)
    return state, rhos, temps


def test_floor_raises_rho_for_floor_steps_then_ends():
    X = _data()
    engine = _engine()
    m = DriftMonitor(engine, "page_hinkley", "floor", rho_floor=0.3, floor_steps=5)
    state = engine.init(X[:100], seed=1)
    state, _, _ = _run(engine, m, state, X, 40)
    assert not m.active
    m.respond(step=state.step)                               # a detection at step 40
    assert m.active
    state, rhos, _ = _run(engine, m, state, X, 10)
    # updates 41..45 at the floor (above base there), 46.. the configured schedule again
    assert rhos[:5] == [0.3] * 5
    assert rhos[5:] == [BASE(t) for t in range(46, 51)]
    assert not m.active and engine.schedule == BASE


def test_restart_puts_the_clock_back_to_its_start():
    X = _data()
    engine = _engine()
    m = DriftMonitor(engine, "adwin", "restart")
    state = engine.init(X[:100], seed=1)
    state, before, _ = _run(engine, m, state, X, 30)
    assert before == [BASE(t) for t in range(1, 31)]
    m.respond(step=30)
    state, rhos, _ = _run(engine, m, state, X, 20)
    assert rhos == [BASE(t) for t in range(1, 21)]          # ρ_31 = ρ_1, ρ_32 = ρ_2, ...
    assert not m.active                                      # instantaneous, permanent
    m.respond(step=50)                                       # a second change restarts it again
    state, rhos, _ = _run(engine, m, state, X, 3)
    assert rhos == [BASE(1), BASE(2), BASE(3)]


def test_reanneal_restarts_the_annealer_then_ends():
    X = _data()
    ann = Deterministic(T0=5.0, rate=0.8, n_steps=10)
    engine = _engine(annealer=ann)
    m = DriftMonitor(engine, "page_hinkley", "reanneal")
    state = engine.init(X[:100], seed=1)
    state, _, temps = _run(engine, m, state, X, 20)
    assert temps[0] == 5.0 and temps[-1] == 1.0
    m.respond(step=20)
    assert m.active and isinstance(engine.annealer, Reannealed)
    state, rhos, temps = _run(engine, m, state, X, 15)
    assert temps == [ann.temperature(t) for t in range(1, 16)]   # T_21 = T_1 = 5, ..., 1 after 10
    assert rhos == [BASE(t) for t in range(21, 36)]              # ρ untouched
    assert not m.active and engine.annealer == ann


def test_reanneal_needs_an_annealer_that_ends():
    with pytest.raises(ValueError, match="reanneal"):
        DriftMonitor(_engine(), "page_hinkley", "reanneal")


def test_restart_bounds_per_row_clocks_by_the_restarted_global_clock():
    a = Adjusted(BASE, offset=100, now=103)
    rows = np.array([1, 2, 50])
    assert np.allclose(a.at_steps(rows), np.maximum(BASE.at_steps(rows), BASE(3)))
    assert np.allclose(a.many(rows.astype(float)), np.maximum(BASE.many(rows), BASE(3)))
    assert Adjusted(BASE, floor=0.5).at_steps(np.array([1, 1000])).min() == 0.5


def _step_sequence(seed, n_before=200, n_after=200, drop=0.5, sd=0.1, trend=False):
    rng = np.random.default_rng(seed)
    level = np.r_[np.full(n_before, -10.0), np.full(n_after, -10.0 - drop)]
    if trend:                                                    # a learning curve rising to -10
        level = level - 2.0 * np.exp(-np.arange(len(level)) / 30.0)
    return level + rng.normal(0, sd, len(level))


def _detections(monitor, lpds):
    out = []
    for t, v in enumerate(lpds, start=1):
        ev = monitor.observe(SimpleNamespace(step=t), float(v), 100)
        if ev is not None:
            out.append(ev.step)
    return out


@pytest.mark.parametrize("detector, within, min_found", [("page_hinkley", 12, 20), ("adwin", 30, 18)])
def test_detector_fires_on_a_drop_and_not_on_a_stationary_sequence(detector, within, min_found):
    # A drop of 5 sds of one batch's lpd at batch 200, on top of a learning curve, 20 seeds:
    # Page-Hinkley finds every one within 12 batches (measured: 4-11), once; ADWIN at least
    # 18 of 20 within 30 batches (measured: 19, 8-27 batches; river's ADWIN empties its window
    # after every cut, a rise included, and a drop just after such a cut can go unseen).
    # The same sequences without the drop, 50 seeds x 400 batches: no alarm at all (the
    # false-alarm tolerance is 0 in 20,000 batches; measured 0 in 100 seeds).
    found = 0
    for seed in range(20):
        m = DriftMonitor(_engine(), detector, "floor", rho_floor=0.2, floor_steps=50)
        steps = _detections(m, _step_sequence(seed, trend=True))
        assert len(steps) <= 1 and all(200 < s for s in steps), (seed, steps)
        found += bool(steps) and steps[0] <= 200 + within
    assert found >= min_found
    for seed in range(50):
        m = DriftMonitor(_engine(), detector, "floor", rho_floor=0.2, floor_steps=50)
        assert _detections(m, _step_sequence(seed, drop=0.0, trend=True)) == [], seed


@pytest.mark.parametrize("detector", ["page_hinkley", "adwin"])
def test_a_rise_is_not_a_change_unless_direction_both(detector):
    lpds = _step_sequence(3, drop=-0.5)                          # lpd goes up by 5 sds
    assert _detections(DriftMonitor(_engine(), detector, "floor"), lpds) == []
    assert len(_detections(DriftMonitor(_engine(), detector, "floor", direction="both"), lpds)) == 1


def test_an_event_says_what_was_done():
    engine = _engine()
    m = DriftMonitor(engine, "page_hinkley", "floor", rho_floor=0.25, floor_steps=40)
    lpds = _step_sequence(0)
    for t, v in enumerate(lpds, start=1):                      # up to the first event
        e = m.observe(SimpleNamespace(step=t), float(v), 100)
        if e is not None:
            break
    assert e is not None and m.active
    assert e.detector == "page_hinkley" and e.response == "floor"
    assert e.detail["until"] == e.step + 40 and e.detail["rho_next"] == 0.25
    assert e.message().startswith(f"drift detected at step {e.step} by page_hinkley")
    assert "rho >= 0.25 until step" in e.message()
    reg = CollectorRegistry()
    metrics = DaemonMetrics(reg)
    metrics.observe_drift(m, e)
    labels = {"detector": "page_hinkley", "response": "floor"}
    assert reg.get_sample_value("streamsvi_drift_detected_total", labels) == 1.0
    assert reg.get_sample_value("streamsvi_drift_response_active") == 1.0
    assert reg.get_sample_value("streamsvi_drift_last_detection_step") == e.step


@pytest.mark.parametrize("response", ["floor", "restart", "reanneal"])
def test_checkpoint_round_trip_resumes_a_response_in_progress(tmp_path, response):
    X = _data()
    ann = Deterministic(T0=4.0, rate=0.8, n_steps=12) if response == "reanneal" else None
    engine = _engine(annealer=ann)
    m = DriftMonitor(engine, "page_hinkley", response, rho_floor=0.3, floor_steps=8)
    state = engine.init(X[:100], seed=1)
    state, _, _ = _run(engine, m, state, X, 20, lpds=-np.linspace(5, 3, 20))
    m.respond(step=20)
    state, _, _ = _run(engine, m, state, X, 3, lpds=[-3.0] * 3)
    # checkpoint at step 23: the engine state file and the monitor's JSON
    save_state(tmp_path / "s.npz", engine, state)
    saved = json.loads(json.dumps(m.to_dict()))
    # the uninterrupted run
    ref_state, ref_rhos, ref_temps = _run(engine, m, state, X, 12, lpds=[-3.0] * 12)
    # a restart: the engine as configured, the state from the file, the monitor from JSON
    engine2, state2 = load_state(tmp_path / "s.npz")
    assert engine2.schedule == BASE and engine2.annealer == ann   # settings as configured
    m2 = DriftMonitor(engine2, "page_hinkley", response, rho_floor=0.3, floor_steps=8).load_dict(saved)
    assert m2.to_dict() == saved
    state2, rhos, temps = _run(engine2, m2, state2, X, 12, lpds=[-3.0] * 12)
    assert rhos == ref_rhos and temps == ref_temps
    for k in ref_state.lam:
        assert np.array_equal(ref_state.lam[k], state2.lam[k])
    assert m2.to_dict() == m.to_dict()
    if response == "floor":
        assert ref_rhos[:5] == [0.3] * 5 and ref_rhos[5] < 0.3     # ends at step 28 = 20 + 8


def test_load_dict_refuses_what_is_not_a_monitor_state():
    with pytest.raises(ValueError, match="not a drift monitor state"):
        DriftMonitor(_engine(), "adwin", "restart").load_dict({"format": "x"})


CFG = """
[model]
kind = "gmm"
n_components = 3
n_features = 2
[inference]
n_total = 1000
batch_size = 100
{inference}
[source]
kind = "file"
path = "x.jsonl"
[checkpoint]
directory = "c"
[drift]
{drift}
"""


def _cfg(drift, inference=""):
    return validate(tomllib.loads(CFG.format(drift=drift, inference=inference)))


@pytest.mark.parametrize("drift, inference, field", [
    ('detector = "cusum"', "", "drift.detector"),
    ('detector = "adwin"\nresponse = "forget"', "", "drift.response"),
    ('detector = "adwin"\nresponse = "reanneal"', "", "drift.response"),
    ('detector = "adwin"\nrho_floor = 0', "", "drift.rho_floor"),
    ('detector = "adwin"\nrho_floor = 1.5', "", "drift.rho_floor"),
    ('detector = "adwin"\nfloor_steps = 0', "", "drift.floor_steps"),
    ('detector = "adwin"\nwarmup = "ten"', "", "drift.warmup"),
    ('detector = "adwin"\nwindow = 3', "", "drift"),
])
def test_config_errors_name_the_field(drift, inference, field):
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        _cfg(drift, inference)


def test_from_config():
    assert DriftMonitor.from_config(_cfg(""), _engine()) is None            # detector = none (default)
    cfg = _cfg('detector = "page_hinkley"\nresponse = "reanneal"\nthreshold = 10',
               '[inference.annealing]\nkind = "deterministic"\nn_steps = 20')
    engine = _engine(annealer=Deterministic(n_steps=20))
    m = DriftMonitor.from_config(cfg, engine)
    assert (m.detector, m.response, m.threshold) == ("page_hinkley", "reanneal", 10.0)


def test_restart_on_a_row_wise_model_raises_the_rows_steps():
    # PMF's rows run on their own clocks: after a restart each touched row's step is at least
    # the restarted global schedule's, so λ moves more than without the response
    from streamsvi.models import PMF, Ratings

    rng = np.random.default_rng(0)
    users, items = rng.integers(0, 30, 4000), rng.integers(0, 20, 4000)
    x = Ratings(users, items, rng.normal(3, 1, 4000))
    batches = [x[np.arange(s, s + 100)] for s in range(0, 4000, 100)]
    lams = {}
    for respond in (False, True):
        engine = SVI(PMF(n_factors=2), n_total=4000, schedule=BASE)
        m = DriftMonitor(engine, "page_hinkley", "restart")
        state = engine.init(batches[0], seed=0)
        for i, b in enumerate(batches):
            state, _ = engine.update(state, b)
            m.observe(state, None, 0)
            if respond and i == 29:
                m.respond(step=state.step)
                assert isinstance(engine.schedule, Adjusted) and engine.schedule.now == 31
        lams[respond] = state
    assert lams[True].step == lams[False].step == 40
    moved = [np.abs(lams[True].lam[k] - lams[False].lam[k]).max() for k in lams[True].lam]
    assert max(moved) > 1e-3
