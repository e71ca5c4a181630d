"""compose/ cannot run here (no image registry), so every file is checked offline:
the compose file by docker-compose, the Prometheus files by promtool (config, rules,
and unit tests of the alerts), the dashboard against the metrics the daemon exports."""
import json
import re
import subprocess
from pathlib import Path


from tests.conftest import require_tool
import yaml

from streamsvi.cli import build_parser
from streamsvi.service.config import load_config
from streamsvi.service.metrics import DaemonMetrics, ScaleoutMetrics

COMPOSE = Path(__file__).resolve().parents[1] / "compose"


def _run(*cmd, cwd=COMPOSE):
    res = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return res.stdout + res.stderr


def test_compose_file_is_valid():
    out = _run(require_tool("docker-compose"), "-f", "docker-compose.yml", "config")
    cfg = yaml.safe_load(out)
    assert {"kafka", "producer", "streamsvi", "prometheus", "grafana"} <= set(cfg["services"])
    for svc in ("kafka", "streamsvi", "prometheus", "grafana"):
        assert "healthcheck" in cfg["services"][svc], svc
    assert any("/var/lib/streamsvi" in str(v) for v in cfg["services"]["streamsvi"]["volumes"])
    # published ports are bound to loopback only
    for svc in cfg["services"].values():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:") or (isinstance(port, dict)
                                                          and port.get("host_ip") == "127.0.0.1"), port


def test_compose_commands_parse_and_the_config_validates():
    spec = yaml.safe_load((COMPOSE / "docker-compose.yml").read_text())
    parser = build_parser()
    for svc in ("producer", "streamsvi"):
        cmd = spec["services"][svc]["command"]
        assert cmd[0] == "streamsvi"
        parser.parse_args(cmd[1:])
    cfg = load_config(COMPOSE / "streamsvi.toml")
    assert cfg["source"]["bootstrap_servers"] == "kafka:9092"
    assert cfg["checkpoint"]["directory"] == "/var/lib/streamsvi/checkpoints"
    dockerfile = (COMPOSE / "Dockerfile").read_text()
    for src in re.findall(r"^COPY (\S+)", dockerfile, re.M):
        assert (COMPOSE.parent / src).exists(), src


def test_prometheus_config_rules_and_alert_unit_tests():
    promtool = require_tool("promtool")
    _run(promtool, "check", "config", "prometheus/prometheus.yml")
    _run(promtool, "check", "rules", "prometheus/rules.yml")
    out = _run(promtool, "test", "rules", "rules_test.yml", cwd=COMPOSE / "prometheus")
    assert "SUCCESS" in out
    names = {r["alert"] for g in yaml.safe_load((COMPOSE / "prometheus/rules.yml").read_text())["groups"]
             for r in g["rules"]}
    assert names == {"StreamsviDown", "StreamsviCheckpointTooOld", "StreamsviLagGrowing",
                     "StreamsviDeadLetterRateHigh", "StreamsviElboNotFinite"}


def _exported_series():
    names = set()
    m = DaemonMetrics()
    ScaleoutMetrics(m.registry)          # the roles' metrics (--role worker|applier)
    for mf in m.registry.collect():
        if mf.type == "counter":
            names |= {mf.name + "_total", mf.name + "_created"}
        elif mf.type == "histogram":
            names |= {mf.name + s for s in ("_bucket", "_count", "_sum", "_created")}
        else:
            names.add(mf.name)
    return names


def test_every_dashboard_and_alert_query_names_a_real_metric():
    exported = _exported_series()
    dash = json.loads((COMPOSE / "grafana/dashboards/streamsvi.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    rules = yaml.safe_load((COMPOSE / "prometheus/rules.yml").read_text())
    exprs += [r["expr"] for g in rules["groups"] for r in g["rules"]]
    used = set()
    for e in exprs:
        for name in re.findall(r"\bstreamsvi_[a-z_]+", e):
            assert name in exported, f"{name} (in {e!r}) is not exported by the daemon"
            used.add(name)
    # the dashboard shows what the issue asks for
    wanted = ["streamsvi_elbo", "streamsvi_elbo_per_record", "streamsvi_heldout_loglik_per_record",
              "streamsvi_gradient_variance_estimate", "streamsvi_gradient_variance_observed",
              "streamsvi_step_size", "streamsvi_svi_plus_noise_std", "streamsvi_records_consumed_total",
              "streamsvi_update_duration_seconds_bucket", "streamsvi_consumer_lag_records",
              "streamsvi_records_dead_lettered_total", "streamsvi_last_checkpoint_timestamp_seconds"]
    assert not set(wanted) - used
    assert all(p["datasource"]["uid"] == "prometheus" for p in dash["panels"])
    ds = yaml.safe_load((COMPOSE / "grafana/provisioning/datasources/prometheus.yml").read_text())
    assert ds["datasources"][0]["uid"] == "prometheus"


def test_scaleout_compose_override_is_valid_and_its_roles_parse():
    out = _run(require_tool("docker-compose"), "-f", "docker-compose.yml", "-f", "docker-compose.scaleout.yml",
               "config")
    svc = yaml.safe_load(out)["services"]
    workers = sorted(k for k in svc if k.startswith("worker-"))
    assert workers == ["worker-1", "worker-2", "worker-3"]
    parser = build_parser()
    assert parser.parse_args(svc["streamsvi"]["command"][1:]).role == "applier"
    ids = set()
    for w in workers:
        assert parser.parse_args(svc[w]["command"][1:]).role == "worker"
        ids.add(svc[w]["environment"]["STREAMSVI_WORKER_ID"])
        assert svc[w]["restart"] == "unless-stopped"      # back under the same transactional id
        assert any("/var/lib/streamsvi" in str(v) for v in svc[w]["volumes"])   # the shared λ file
    assert len(ids) == 3
    cfg = load_config(COMPOSE / "streamsvi-scaleout.toml")
    assert cfg["scaleout"]["deltas_topic"] in svc["topics"]["command"]
    assert cfg["scaleout"]["lambda_file"].startswith("/var/lib/streamsvi/")
    promtool = require_tool("promtool")
    _run(promtool, "check", "config", "prometheus/prometheus-scaleout.yml")
    prom = yaml.safe_load((COMPOSE / "prometheus/prometheus-scaleout.yml").read_text())
    targets = {t for sc in prom["scrape_configs"] for g in sc["static_configs"] for t in g["targets"]}
    assert targets == {"streamsvi:9464"} | {f"{w}:9464" for w in workers}
    dash = json.loads((COMPOSE / "grafana/dashboards/streamsvi.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in ("streamsvi_delta_records_total", "streamsvi_delta_staleness", "streamsvi_consumer_lag_records"):
        assert name in exprs
