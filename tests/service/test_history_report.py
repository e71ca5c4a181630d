"""The daemon's metric history, `streamsvi report`, and a real Prometheus reading a running daemon."""
import io
import json
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.checkpoint import load_snapshot
from streamsvi.cli import main
from streamsvi.io.dense import JsonCodec
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon
from streamsvi.service.history import read_history
from tests.conftest import require_tool
from tests.service.conftest import blob_rows, gmm_config


def _file_cfg(tmp_path, name, n=2000, **inference):
    data = tmp_path / f"{name}.jsonl"
    data.write_bytes(b"".join(JsonCodec(2).encode(r) + b"\n" for r in blob_rows(n, seed=1)))
    return validate(gmm_config(tmp_path, name=name, source={"kind": "file", "path": str(data)},
                               inference=inference,
                               metrics={"history_every": 4, "heldout_size": 50, "heldout_every": 10}))


def test_history_rows_match_the_run(tmp_path):
    cfg = _file_cfg(tmp_path, "svi", effective_batch_size=None)
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True)
    rows = read_history(cfg["checkpoint"]["directory"])
    steps = [r["step"] for r in rows]
    kept = {1} | {s for s in range(1, res.batches + 1) if s % 4 == 0 or s % 10 == 0}
    # plus the last update before each checkpoint (every 5 batches, and at shutdown)
    assert set(steps) - kept <= {s for s in range(5, res.batches + 1, 5)} | {res.batches}
    assert kept <= set(steps) and steps == sorted(steps) and steps[-1] == res.batches
    by_step = {h[0]: h for h in load_snapshot(cfg["checkpoint"]["directory"]).extra["elbo_history"]}
    for r in rows:
        assert r["elbo_per_record"] == pytest.approx(by_step[r["step"]][1], rel=1e-12)
        assert (r["heldout_loglik"] is not None) == (r["step"] % 10 == 0 or r["step"] == 1)
        assert r["rho"] == pytest.approx((1.0 + r["step"]) ** -0.7)
    assert rows[-1]["records"] == res.records
    # a replayed step (after a crash) and a torn line are tolerated: last row of a step wins
    hist = tmp_path / "svi" / "history.jsonl"
    with open(hist, "a") as f:
        f.write(json.dumps({**rows[-1], "elbo_per_record": 123.0}) + "\n" + '{"step": 9')
    assert read_history(hist)[-1]["elbo_per_record"] == 123.0 and len(read_history(hist)) == len(rows)


def test_report_draws_runs_side_by_side(tmp_path, capsys):
    import matplotlib.image

    for name, m in (("svi", None), ("svi_plus", 10)):
        Daemon(_file_cfg(tmp_path, name, effective_batch_size=m), out=io.StringIO()).run(until_drained=True)
    out = tmp_path / "report.png"
    assert main(["report", str(tmp_path / "svi"), str(tmp_path / "svi_plus"), "--labels", "SVI", "SVI+ M=10",
                 "--output", str(out)]) == 0
    img = matplotlib.image.imread(out)
    assert img.shape[0] > 500 and img.shape[1] > 1000 and img[..., :3].std() > 0.05
    text = capsys.readouterr().out
    assert "SVI: " in text and "SVI+ M=10: " in text and str(out) in text
    assert main(["report", str(tmp_path / "nothing"), "--output", str(out)]) == 2


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_prometheus_reads_the_elbo_of_a_running_daemon(tmp_path):
    prometheus = require_tool("prometheus")
    cfg = _file_cfg(tmp_path, "live", n=1000)
    cfg["metrics"]["enabled"] = True
    cfg["metrics"]["port"] = _free_port()
    registry = CollectorRegistry()
    daemon = Daemon(cfg, registry=registry, out=io.StringIO())
    runner = threading.Thread(target=daemon.run, kwargs={"timeout": 60})
    runner.start()
    prom_port = _free_port()
    (tmp_path / "prometheus.yml").write_text(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: streamsvi\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{cfg['metrics']['port']}']\n")
    proc = subprocess.Popen([prometheus, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{prom_port}"],
                            stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prom.log", "wb"))
    try:
        value, deadline = None, time.monotonic() + 40
        while value is None and time.monotonic() < deadline:
            time.sleep(1)
            try:
                url = f"http://127.0.0.1:{prom_port}/api/v1/query?query=" + urllib.parse.quote("streamsvi_elbo")
                with urllib.request.urlopen(url, timeout=2) as r:
                    result = json.load(r)["data"]["result"]
                value = float(result[0]["value"][1]) if result else None
            except OSError:
                continue
        # the file is drained within a second, so the daemon's ELBO gauge is final by now
        assert value is not None, (tmp_path / "prom.log").read_text()[-2000:]
        assert np.isfinite(value)
        assert value == pytest.approx(registry.get_sample_value("streamsvi_elbo"), rel=1e-12)
    finally:
        daemon.request_stop()
        runner.join(timeout=30)
        proc.terminate()
        proc.wait(timeout=10)
    assert not runner.is_alive()
