"""Metrics: the exposition is lint-clean (promtool) and a real Prometheus server scrapes it."""
import socket
import subprocess
import time
import urllib.parse
import urllib.request
import json

import numpy as np
import pytest
from prometheus_client import generate_latest

from streamsvi.datasets import make_blobs
from streamsvi.inference import SVI, RobbinsMonro
from streamsvi.models import BayesianGMM
from streamsvi.service.metrics import DaemonMetrics
from tests.conftest import require_tool


def _fed_metrics(steps=12):
    X, _ = make_blobs(600, seed=0)
    engine = SVI(BayesianGMM(4, 2), n_total=len(X), schedule=RobbinsMonro(1.0, 0.7),
                 effective_batch_size=5)
    state = engine.init(X, seed=0)
    m = DaemonMetrics()
    for t in range(steps):
        state, info = engine.update(state, X[50 * t % 550:50 * t % 550 + 50])
        m.observe_update(info, info.gradient, 0.002)
    m.observe_dead("non_finite", 3)
    m.observe_dead("json_invalid")
    m.set_lag({("gmm-records", 0): 12, ("gmm-records", 1): 0})
    m.heldout_loglik.set(float(np.mean(engine.model.predictive_logpdf(state.lam, X[:100]))))
    return m, state, info


def test_values_are_what_the_engine_reported():
    m, state, info = _fed_metrics()
    r = m.registry
    assert r.get_sample_value("streamsvi_step") == info.step == 12
    assert r.get_sample_value("streamsvi_elbo_per_record") == pytest.approx(info.elbo_per_record)
    assert r.get_sample_value("streamsvi_step_size") == pytest.approx(info.rho)
    assert r.get_sample_value("streamsvi_svi_plus_noise_std") == pytest.approx(3.0)
    assert r.get_sample_value("streamsvi_gradient_variance_estimate") == pytest.approx(info.grad_variance)
    assert r.get_sample_value("streamsvi_records_consumed_total") == 600
    assert r.get_sample_value("streamsvi_records_dead_lettered_total", {"reason": "non_finite"}) == 3
    assert r.get_sample_value("streamsvi_consumer_lag_records",
                              {"topic": "gmm-records", "partition": "0"}) == 12
    assert r.get_sample_value("streamsvi_update_duration_seconds_count") == 12
    assert r.get_sample_value("streamsvi_gradient_variance_observed") > 0


def test_observed_variance_is_the_successive_difference_estimator():
    from streamsvi.models import NatParams

    m = DaemonMetrics(fading_factor=1.0)      # EWMean with factor 1 keeps the last value
    g1, g2 = NatParams(a=[1.0, 2.0]), NatParams(a=[4.0, -2.0])
    info = type("I", (), dict(elbo=0.0, elbo_per_record=0.0, grad_variance=0.0, grad_norm=0.0, rho=0.1,
                              noise_std=0.0, effective_batch_size=1, step=1, batch_size=1,
                              domain_clipped=0))()
    m.observe_update(info, g1)
    m.observe_update(info, g2)
    assert m.registry.get_sample_value("streamsvi_gradient_variance_observed") == 0.5 * (9 + 16)


def test_promtool_check_metrics_is_clean():
    promtool = require_tool("promtool")
    m, _, _ = _fed_metrics()
    text = generate_latest(m.registry)
    res = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), \
        (res.stdout.decode(), res.stderr.decode())


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_real_prometheus_scrapes_the_endpoint(tmp_path):
    prometheus = require_tool("prometheus")
    m, _, info = _fed_metrics()
    server, thread = m.serve(0)
    port = server.server_port
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
        assert "streamsvi_elbo_per_record" in body
        prom_port = _free_port()
        (tmp_path / "prometheus.yml").write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: streamsvi\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{port}']\n")
        proc = subprocess.Popen(
            [prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "wb"))
        try:
            q = urllib.parse.quote("streamsvi_step")
            deadline, value = time.monotonic() + 40, None
            while time.monotonic() < deadline and value is None:
                time.sleep(1)
                try:
                    with urllib.request.urlopen(
                            f"http://127.0.0.1:{prom_port}/api/v1/query?query={q}", timeout=2) as r:
                        res = json.load(r)["data"]["result"]
                    if res:
                        value = float(res[0]["value"][1])
                except OSError:
                    continue
            assert value == info.step, (tmp_path / "prometheus.log").read_text()[-2000:]
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    finally:
        server.shutdown()


# ------------------------------------------------- gauges without a value are absent, never 0
_UNSET_UNTIL_AN_UPDATE = ["streamsvi_elbo", "streamsvi_elbo_per_record", "streamsvi_gradient_variance_estimate",
                          "streamsvi_gradient_variance_observed", "streamsvi_gradient_norm", "streamsvi_step_size",
                          "streamsvi_svi_plus_noise_std", "streamsvi_effective_batch_size"]


def _samples(body: str) -> dict:
    """``{name: value}`` of the label-free samples of an exposition text."""
    out = {}
    for line in body.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_a_fresh_registry_has_no_made_up_values():
    m = DaemonMetrics()
    for name in _UNSET_UNTIL_AN_UPDATE + ["streamsvi_heldout_loglik_per_record",
                                          "streamsvi_last_checkpoint_timestamp_seconds"]:
        assert m.registry.get_sample_value(name) is None, name
    assert m.registry.get_sample_value("streamsvi_step") == 0.0        # a true 0: no update yet
    m.elbo.set(-12.5)
    assert m.registry.get_sample_value("streamsvi_elbo") == -12.5
    m.elbo.set(float("nan"))                                          # a diverged value is shown as it is
    assert np.isnan(m.registry.get_sample_value("streamsvi_elbo"))
    text = generate_latest(DaemonMetrics().registry).decode()
    assert "# TYPE streamsvi_elbo gauge" in text and "streamsvi_elbo " not in _samples(text)


def _daemon_cfg(tmp_path, data, n_total=1000):
    from streamsvi.service.config import validate

    return validate({
        "model": {"kind": "gmm", "n_components": 3, "n_features": 2},
        "inference": {"n_total": n_total, "batch_size": 100, "effective_batch_size": 25},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(tmp_path / "dead.jsonl")},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 2},
        "metrics": {"enabled": True, "port": 0, "heldout_size": 50, "heldout_every": 1000,
                    "progress_seconds": 0.0},
    })


def _scrape_while_running(cfg, ready):
    """Run a daemon in a thread; scrape its real /metrics until ``ready(samples)``; stop it."""
    import io
    import threading

    from streamsvi.service.daemon import Daemon

    daemon = Daemon(cfg, out=io.StringIO())
    result = {}
    thread = threading.Thread(target=lambda: result.update(res=daemon.run(timeout=120)), daemon=True)
    thread.start()
    try:
        deadline, body = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            server = daemon.metrics_server
            if server is not None:
                with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5) as r:
                    body = r.read().decode()
                if ready(_samples(body)):
                    break
            time.sleep(0.05)
        else:
            raise AssertionError(f"the daemon's metrics never got ready:\n{body}")
    finally:
        daemon.request_stop()
        thread.join(timeout=60)
    assert not thread.is_alive() and result["res"].stopped_by == "requested"
    return body


def test_the_endpoint_shows_no_elbo_before_the_first_update(tmp_path):
    """Issue 16: streamsvi_elbo read 0.0 before the first batch."""
    (tmp_path / "empty.jsonl").write_text("")
    body = _scrape_while_running(_daemon_cfg(tmp_path, tmp_path / "empty.jsonl"),
                                 lambda s: "streamsvi_step" in s)
    samples = _samples(body)
    for name in _UNSET_UNTIL_AN_UPDATE + ["streamsvi_heldout_loglik_per_record",
                                          "streamsvi_last_checkpoint_timestamp_seconds"]:
        assert name not in samples and f"# TYPE {name} gauge" in body, name
    assert samples["streamsvi_step"] == 0.0 and samples["streamsvi_heldout_records"] == 0.0
    promtool = require_tool("promtool")
    res = subprocess.run([promtool, "check", "metrics"], input=body.encode(), capture_output=True, timeout=30)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), \
        (res.stdout.decode(), res.stderr.decode())


def test_the_endpoint_shows_no_heldout_loglik_after_a_resume_until_it_is_computed(tmp_path):
    """Issue 16: streamsvi_heldout_loglik_per_record read 0.0 after a resume."""
    import io

    from streamsvi.service.daemon import Daemon

    data = tmp_path / "points.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in make_blobs(650, seed=3)[0].tolist()))
    cfg = _daemon_cfg(tmp_path, data, n_total=650)
    first = Daemon(cfg, out=io.StringIO())
    assert first.run(until_drained=True, timeout=120).stopped_by == "drained"
    assert first.metrics.registry.get_sample_value("streamsvi_heldout_loglik_per_record") == \
        pytest.approx(first.heldout_ll)                     # evaluated at step 1 of the first run
    body = _scrape_while_running(cfg, lambda s: s.get("streamsvi_heldout_records") == 50)
    samples = _samples(body)
    assert samples["streamsvi_step"] == first.state.step and samples["streamsvi_records_seen"] == 600
    assert samples["streamsvi_last_checkpoint_timestamp_seconds"] > 0          # restored from the snapshot
    for name in _UNSET_UNTIL_AN_UPDATE + ["streamsvi_heldout_loglik_per_record"]:
        assert name not in samples, name
