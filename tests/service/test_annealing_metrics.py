"""streamsvi_annealing_level: set from the engine's UpdateInfo, labelled by kind, lint-clean."""
import json
import subprocess

import pytest
from prometheus_client import generate_latest

from streamsvi.datasets import make_blobs
from streamsvi.inference import SVI, Constant
from streamsvi.inference.annealing import Deterministic, Stochastic, SVIPlus
from streamsvi.models import BayesianGMM
from streamsvi.service.metrics import DaemonMetrics
from tests.conftest import require_tool
from tests.service.test_metrics import _daemon_cfg, _scrape_while_running


@pytest.mark.parametrize("ann, expect", [
    (Deterministic(T0=4.0, rate=0.5), lambda t: 1 + 3 * 0.5 ** (t - 1)),
    (Stochastic(rho0=0.8, decay=0.5), lambda t: 0.8 * 0.5 ** (t - 1)),
    (SVIPlus(5.0, schedule="linear", increment=5.0), lambda t: (50 / (5 + 5 * t) - 1) ** 0.5),
])
def test_gauge_is_the_annealers_level(ann, expect):
    X, _ = make_blobs(300, seed=0)
    engine = SVI(BayesianGMM(3, 2), n_total=len(X), schedule=Constant(0.5), annealer=ann)
    state = engine.init(X, seed=0)
    m = DaemonMetrics()
    for t in range(1, 4):
        state, info = engine.update(state, X[50 * t:50 * t + 50])
        m.observe_update(info, info.gradient, 0.001, annealing_kind=engine.annealing.kind)
        got = m.registry.get_sample_value("streamsvi_annealing_level", {"kind": ann.kind})
        assert got == pytest.approx(expect(t))
    text = generate_latest(m.registry)
    res = subprocess.run([require_tool("promtool"), "check", "metrics"], input=text,
                         capture_output=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_daemon_serves_the_annealing_level(tmp_path):
    """A real daemon with [inference.annealing] kind = deterministic: the scraped gauge is T_t."""
    X, _ = make_blobs(600, seed=1)
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps(list(map(float, r))) + "\n" for r in X))
    cfg = _daemon_cfg(tmp_path, data)
    cfg["inference"]["effective_batch_size"] = None
    cfg["inference"]["annealing"] = Deterministic(T0=3.0, rate=0.5, n_steps=50).to_dict()
    body = _scrape_while_running(cfg, lambda s: s.get("streamsvi_step", 0) >= 2)
    step = None
    for line in body.splitlines():
        if line.startswith("streamsvi_step "):
            step = int(float(line.split()[1]))
    level = [ln for ln in body.splitlines() if ln.startswith('streamsvi_annealing_level{kind="deterministic"}')]
    assert len(level) == 1 and step is not None
    # the gauge is T_t of an update t <= the step shown (the gauge is exposed before the
    # step, and an update may land between the two reads)
    assert float(level[0].split()[1]) in [pytest.approx(1 + 2 * 0.5 ** (t - 1))
                                          for t in range(max(1, step - 8), step + 1)]
