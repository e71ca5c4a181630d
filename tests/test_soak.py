"""The soak (bench/soak.py): its growth rule on made-up series (seconds), and a real 5-minute soak.

The 5-minute soak runs ``bench/soak.py`` as a user would: one local broker, every model kind's
daemon (``streamsvi run``) at once, each fed a steady 10 records/s, sampled every 5 s; the daemons
are stopped with SIGTERM. It takes about 5 min 15 s (two cores).
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import generate_latest

from streamsvi.models import CONFIG_KINDS
from streamsvi.service.metrics import DaemonMetrics

BENCH = Path(__file__).resolve().parents[1] / "bench"
sys.path.insert(0, str(BENCH))
import soak  # noqa: E402  (bench/soak.py)

MB = 2 ** 20
RATE = 10.0


def series(n=60, dt=5.0, **add):
    """``n`` samples ``dt`` apart of a steady daemon (80 MB, 15 fds, a checkpoint every other
    sample, 3 kept, a backlog of 8 records); ``add``: key -> function of the sample index whose
    value is added to that key's."""
    out = []
    for i in range(n):
        s = {"t": i * dt, "alive": True, "rc": None, "rss": 80 * MB, "fds": 15, "snapshots": min(3, i // 2),
             "checkpoints": float(i // 2), "lag": 0, "backlog": 8}
        for key, f in add.items():
            s[key] = s[key] + f(i)
        out.append(s)
    return out


def test_a_flat_series_passes():
    reasons, numbers = soak.growth_verdict(series(), RATE)
    assert reasons == []
    assert numbers["rss_growth_mb"] == 0 and numbers["fd_growth"] == 0 and numbers["backlog_growth"] == 0


def test_noise_and_a_warm_up_pass():
    rng = np.random.default_rng(0)
    noise = rng.integers(-2 * MB, 2 * MB, 60)
    s = series(rss=lambda i: int(noise[i]) + (0 if i >= 10 else -40 * MB + 4 * MB * i),   # grows in the warm-up
               fds=lambda i: (1 if i % 7 == 0 else 0) - (11 if i < 2 else 0),   # a checkpoint's file now and then
               backlog=lambda i: int(rng.integers(0, 12)))
    assert soak.growth_verdict(s, RATE)[0] == []


def test_rss_that_grows_fails():
    # 1 MB per sample: ~24 MB between the medians of the halves of the last 80 % > 16 MB
    reasons, numbers = soak.growth_verdict(series(rss=lambda i: i * MB), RATE)
    assert any(r.startswith("RSS grew") for r in reasons), reasons
    assert numbers["rss_growth_mb"] > numbers["rss_bound_mb"] == 16.0
    # the same growth, a third as fast, is inside the bound
    assert soak.growth_verdict(series(rss=lambda i: i * MB // 3), RATE)[0] == []


def test_fds_that_grow_fail():
    reasons, _ = soak.growth_verdict(series(fds=lambda i: i // 6), RATE)
    assert any(r.startswith("open fds grew") for r in reasons), reasons
    reasons, _ = soak.growth_verdict(series(fds=lambda i: 20 if i == 50 else 0), RATE)
    assert reasons == ["open fds reached 35 (1st half median 15, allowed +6)"]


def test_lag_that_keeps_growing_fails():
    # consumption at 9 of the 10 records/s produced: the backlog grows 5 records per 5-s sample
    reasons, numbers = soak.growth_verdict(series(backlog=lambda i: 5 * i), RATE)
    assert any(r.startswith("backlog (produced - accounted) grew") for r in reasons), reasons
    assert numbers["lag_slack"] == 100
    reasons, _ = soak.growth_verdict(series(lag=lambda i: 5 * i), RATE)
    assert any(r.startswith("consumer lag metric grew") for r in reasons), reasons


def test_a_daemon_that_exits_fails():
    s = series()
    for x in s[40:]:
        x.update(alive=False, rc=1, rss=None, fds=None, checkpoints=None, lag=None, backlog=None)
    reasons, _ = soak.growth_verdict(s, RATE)
    assert reasons[0] == "daemon exited (rc 1) at t = 200 s"
    assert any("could not be read" in r for r in reasons)


def test_checkpoints_that_stop_or_pile_up_fail():
    s = series()
    for x in s[35:]:
        x["checkpoints"] = s[34]["checkpoints"]
    assert soak.growth_verdict(s, RATE)[0] == ["no checkpoint written in the 2nd half (checkpoints_total "
                                               "stayed at 17)"]
    reasons, _ = soak.growth_verdict(series(snapshots=lambda i: i // 4), RATE)
    assert any("snapshots on disk (keep = 3)" in r for r in reasons), reasons


def test_too_few_samples_fail():
    assert "too few samples" in soak.growth_verdict(series(n=4), RATE)[0][0]


def test_every_model_kind_has_valid_records():
    """The soak covers every kind the daemon runs, and each kind's records are what its daemon
    accepts (decoded and validated as the daemon does); a record it would refuse is refused."""
    assert soak.missing_kinds() == [] and soak.all_kinds() == list(CONFIG_KINDS)
    for i, kind in enumerate(soak.all_kinds()):
        cfg = soak.kind_config(kind, bootstrap="127.0.0.1:9", topic="t", group="g", directory=Path("ck"))
        soak.check_records(cfg, soak.encode(soak.spec(kind).records(np.random.default_rng(i), 200)))
    cfg = soak.kind_config("pmf", bootstrap="127.0.0.1:9", topic="t", group="g", directory=Path("ck"))
    with pytest.raises(ValueError, match=r"pmf: record 1 would be dead-lettered \(out_of_range"):
        soak.check_records(cfg, [b'{"user": 1, "item": 2, "rating": 3}', b'{"user": 1, "item": 2, "rating": 9}'])


def test_a_kind_without_a_soak_entry_is_soaked_from_its_check_case():
    """So a new model family needs no edit here: every kind's check case gives a spec whose
    records its daemon accepts (here for every kind with a case, hand-made entry or not; the
    gradient path's models have no case and keep their entries)."""
    from streamsvi.models import GradientModel

    for i, kind in enumerate(CONFIG_KINDS):
        made = soak.spec_from_check_case(kind)
        if made is None and issubclass(CONFIG_KINDS[kind], GradientModel):
            assert kind in soak.SPECS
            continue
        assert made is not None and made.model["kind"] == kind, kind
        cfg = soak.kind_config(kind, bootstrap="127.0.0.1:9", topic="t", group="g", directory=Path("ck"))
        cfg["model"], cfg["validation"] = dict(made.model), dict(made.validation)
        soak.check_records(cfg, soak.encode(made.records(np.random.default_rng(i), 200)))
    assert "poisson_mixture" not in soak.SPECS or soak.SPECS["poisson_mixture"].model == \
        soak.spec_from_check_case("poisson_mixture").model


def test_accounted_reads_the_daemons_metrics():
    m = DaemonMetrics()
    m.records.inc(120)
    m.heldout_records.set(20)
    m.observe_dead("json_invalid", 2)
    m.set_lag({("t", 0): 7, ("t", 1): 3})
    m.checkpoints.inc(4)
    parsed = soak.parse_metrics(generate_latest(m.registry).decode())
    assert soak.accounted(parsed) == 142
    assert parsed["streamsvi_consumer_lag_records"] == 10 and parsed["streamsvi_checkpoints_total"] == 4


def test_five_minute_soak_of_every_kind(tmp_path):
    out = tmp_path / "soak.json"
    log = tmp_path / "soak.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(BENCH / "soak.py"), "--minutes", "5", "--rate", str(RATE),
                                 "--sample-seconds", "5", "--out", str(out), "--workdir", str(tmp_path / "w")],
                                stdout=f, stderr=subprocess.STDOUT, text=True)
        try:
            rc = proc.wait(timeout=900)
        except subprocess.TimeoutExpired:
            proc.terminate()              # the soak stops its daemons and the broker on SIGTERM
            proc.wait(timeout=60)
            raise
    stdout = log.read_text()
    assert rc == 0, stdout[-8000:]
    summary = json.loads(out.read_text())
    assert summary["passed"] and set(summary["per_kind"]) == set(CONFIG_KINDS)
    for kind, r in summary["per_kind"].items():
        st = r["stats"]
        assert r["passed"] and r["reasons"] == [], (kind, r["reasons"])
        # a steady rate for 5 minutes (the first record at t = 0, the last before t = 300 s)
        assert abs(st["produced"] - RATE * 300) <= RATE * 6, (kind, st["produced"])
        # everything sent was consumed: applied or held out, none dead-lettered, all committed
        assert st["accounted"] == st["produced"] == st["snapshot"]["offsets_end"], (kind, st)
        assert st["snapshot"]["records_seen"] + st["snapshot"]["heldout"] == st["produced"]
        assert st["consumed"] == st["snapshot"]["records_seen"]
        assert st["exit"] == 0
        assert st["checkpoints"] >= 20 and st["max_snapshots"] <= 4         # every 10 s, 3 kept
        assert len(r["samples"]) >= 55
    assert "soak PASSED" in stdout and (out.with_suffix(".md")).exists()
    print(stdout[stdout.index("\nkind "):])      # the table (shown by pytest -rP)
