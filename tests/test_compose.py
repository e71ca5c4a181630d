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
from streamsvi.service.metrics import DaemonMetrics, ScaleoutMetrics, ScorerMetrics

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
    ScorerMetrics(m.registry)            # --role scorer
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


#: Metrics the daemon exports that the dashboard leaves out, with why (none at present: every
#: metric of DaemonMetrics and ScaleoutMetrics has a panel).
LEFT_OUT: dict[str, str] = {}


def _families():
    """Every metric family the daemon, the scale-out roles and the scorer register, and its series names."""
    m = DaemonMetrics()
    ScaleoutMetrics(m.registry)
    ScorerMetrics(m.registry)
    out = {}
    for mf in m.registry.collect():
        if mf.type == "counter":
            out[mf.name] = {mf.name + "_total"}
        elif mf.type == "histogram":
            out[mf.name] = {mf.name + s for s in ("_bucket", "_count", "_sum")}
        else:
            out[mf.name] = {mf.name}
    return out


def test_every_exported_metric_has_a_panel():
    dash = json.loads((COMPOSE / "grafana/dashboards/streamsvi.json").read_text())
    used = {name for p in dash["panels"] for t in p["targets"]
            for name in re.findall(r"\bstreamsvi_[a-z_]+", t["expr"])}
    families = _families()
    assert not set(LEFT_OUT) - set(families), "LEFT_OUT names a metric the daemon does not export"
    missing = sorted(f for f, series in families.items() if f not in LEFT_OUT and not series & used)
    assert not missing, f"no dashboard panel for {missing}: add one, or list it in LEFT_OUT with why"
    # the panels the issue asked for, by what they show
    by_expr = {name: p for p in dash["panels"] for t in p["targets"]
               for name in re.findall(r"\bstreamsvi_[a-z_]+", t["expr"])}
    assert "{{kind}}" in json.dumps(by_expr["streamsvi_annealing_level"]["targets"])
    assert "{{estimator}}" in json.dumps(by_expr["streamsvi_gradient_variance_by_estimator"]["targets"])
    assert by_expr["streamsvi_heldout_log_loss"] is by_expr["streamsvi_heldout_accuracy"]
    # a well-formed dashboard: distinct ids and refIds, panels inside the 24-column grid, none overlapping
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)), p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(g["x"] + i, g["y"] + j) for i in range(g["w"]) for j in range(g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        for o in p["fieldConfig"]["overrides"]:       # an override names a query of its panel
            if o["matcher"]["id"] == "byFrameRefID":
                assert o["matcher"]["options"] in refs, p["title"]


def test_every_dashboard_query_parses(tmp_path):
    """promtool parses each panel's PromQL (each written as a recording rule)."""
    promtool = require_tool("promtool")
    dash = json.loads((COMPOSE / "grafana/dashboards/streamsvi.json").read_text())
    rules = [{"record": f"dashboard:panel{p['id']}:{t['refId']}", "expr": t["expr"]}
             for p in dash["panels"] for t in p["targets"]]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    assert f"{len(rules)} rules found" in _run(promtool, "check", "rules", str(path))


def _mounts(service):
    """(source, target, read_only) of each mount of a ``docker-compose config`` service."""
    out = []
    for v in service.get("volumes", []):
        if isinstance(v, dict):
            out.append((v.get("source"), v["target"], bool(v.get("read_only"))))
        else:
            parts = str(v).split(":")
            out.append((parts[0], parts[1], len(parts) > 2 and "ro" in parts[2].split(",")))
    return out


def _mounted_file(service, target):
    """The compose/ file that ``service`` mounts at ``target`` (read-only)."""
    for src, dst, ro in _mounts(service):
        if dst == target:
            assert ro, f"{target} is mounted writable"
            return Path(src)
    raise AssertionError(f"nothing mounted at {target}: {service.get('volumes')}")


def _created_topics(command: str) -> dict:
    """topic -> (partitions, {config: value}) of each kafka-topics.sh --create in ``command``."""
    out = {}
    for call in command.split(";"):
        if "--create" not in call:
            continue
        words = call.split()
        topic = words[words.index("--topic") + 1]
        configs = dict(words[k + 1].split("=", 1) for k, w in enumerate(words) if w == "--config")
        out[topic] = (int(words[words.index("--partitions") + 1]), configs)
    return out


def test_scaleout_compose_runs_lda_with_workers_and_appliers_sharing_only_kafka():
    from streamsvi.service.roles.worker import check_scaleout_config, lambda_channel

    out = _run(require_tool("docker-compose"), "-f", "docker-compose.yml", "-f", "docker-compose.scaleout.yml",
               "config")
    svc = yaml.safe_load(out)["services"]
    parser = build_parser()
    roles = {}
    for name, s in svc.items():             # every streamsvi command is a valid invocation
        cmd = s.get("command")
        if cmd and cmd[0] == "streamsvi":
            args = parser.parse_args(cmd[1:])
            roles.setdefault(args.role, []).append(name)
            assert args.command == "run" and args.role in ("worker", "applier"), (name, cmd)
            cfg_path = _mounted_file(s, args.config)
            assert cfg_path.parent == COMPOSE and cfg_path.exists(), cfg_path
    workers, appliers = sorted(roles.pop("worker")), sorted(roles.pop("applier"))
    assert not roles and workers == ["worker-1", "worker-2", "worker-3"]
    assert appliers == ["streamsvi", "streamsvi-standby"]              # one active, one standby

    # one config, the LDA one, for every role; it validates for the scaled-out roles
    configs = {_mounted_file(svc[n], parser.parse_args(svc[n]["command"][1:]).config) for n in workers + appliers}
    assert configs == {COMPOSE / "lda-scaleout.toml"}
    cfg = load_config(COMPOSE / "lda-scaleout.toml")
    check_scaleout_config(cfg)
    assert cfg["model"]["kind"] == "lda"
    assert cfg["source"]["bootstrap_servers"] == "kafka:9092"
    assert cfg["scaleout"]["lambda_file"] is None and cfg["scaleout"]["worker_id"] is None
    how, lambda_topic = lambda_channel(cfg)
    assert how == "topic"

    # distinct worker ids (each its Kafka transactional id), back under the same id after a kill
    ids = [svc[w]["environment"]["STREAMSVI_WORKER_ID"] for w in workers]
    assert len(set(ids)) == len(ids) == 3
    for w in workers + appliers:
        assert svc[w]["restart"] == "unless-stopped"

    # no volume shared between a worker and an applier: they share only Kafka (a read-only
    # bind of a compose/ file, the config, is the same file on every host, not shared storage)
    for w in workers:
        for a in appliers:
            shared = {m[0] for m in _mounts(svc[w])} & {m[0] for m in _mounts(svc[a])}
            for src in shared:
                assert all(ro for s, _, ro in _mounts(svc[w]) + _mounts(svc[a]) if s == src), (w, a, src)
                assert Path(src).is_file() and Path(src).parent == COMPOSE, (w, a, src)
    # the appliers share their checkpoint directory (a standby resumes the active one's snapshot)
    ck = cfg["checkpoint"]["directory"]
    held = [{s for s, t, ro in _mounts(svc[a]) if not ro and ck.startswith(t.rstrip("/") + "/")} for a in appliers]
    assert len(held[0]) == 1 and held[0] == held[1], held

    # topics: deltas and lambda with one partition, the data topic one partition per worker at least
    topics = _created_topics(svc["topics"]["command"][-1])
    assert topics[cfg["scaleout"]["deltas_topic"]][0] == 1
    assert topics[lambda_topic][0] == 1
    (data_topic,) = cfg["source"]["topics"]
    assert topics[data_topic][0] >= len(workers)
    for n in workers + appliers + ["producer"]:
        assert svc[n]["depends_on"]["topics"]["condition"] == "service_completed_successfully", n

    # the producer writes bag-of-words documents that fit the model, to the data topic
    import importlib.util
    cmd = svc["producer"]["command"]
    assert cmd[0] == "python"
    script = _mounted_file(svc["producer"], cmd[1])
    spec = importlib.util.spec_from_file_location("produce_lda", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pargs = mod.parser().parse_args(cmd[2:])
    assert pargs.topic == data_topic and pargs.bootstrap_servers == cfg["source"]["bootstrap_servers"]
    assert pargs.words == cfg["model"]["n_features"] and pargs.partitions == topics[data_topic][0]

    # Prometheus scrapes every role; the per-worker panels read its role label
    promtool = require_tool("promtool")
    _run(promtool, "check", "config", "prometheus/prometheus-scaleout.yml")
    prom = yaml.safe_load((COMPOSE / "prometheus/prometheus-scaleout.yml").read_text())
    by_role = {}
    for sc in prom["scrape_configs"]:
        for g in sc["static_configs"]:
            by_role.setdefault(g["labels"]["role"], set()).update(g["targets"])
    assert by_role == {"applier": {f"{a}:9464" for a in appliers}, "worker": {f"{w}:9464" for w in workers}}
    assert {cfg["metrics"]["host"], cfg["metrics"]["port"]} == {"0.0.0.0", 9464}
    dash = json.loads((COMPOSE / "grafana/dashboards/streamsvi.json").read_text())
    exprs = " ".join(t["expr"] for p in dash["panels"] for t in p["targets"])
    for name in ("streamsvi_delta_records_total", "streamsvi_delta_staleness", "streamsvi_consumer_lag_records",
                 'role="worker"', "streamsvi_applier_active"):
        assert name in exprs
