"""The command line as a user meets it: ``streamsvi run`` with bad configs, ``streamsvi demo``."""
import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from streamsvi.checkpoint import load_snapshot
from streamsvi.models import CONFIG_KINDS

from streamsvi.service.tomlw import dump_toml

from .conftest import STREAMSVI, gmm_config

#: A valid config (relative checkpoint directory: next to the config file); each case breaks one thing.
GOOD = gmm_config(Path("."), bootstrap="127.0.0.1:9", topic="t", group="g", checkpoint={"directory": "ck"})


def _with(section, **changes):
    cfg = {s: dict(f) for s, f in GOOD.items()}
    for k, v in changes.items():
        if v is None:
            cfg[section].pop(k, None)
        else:
            cfg[section][k] = v
    return dump_toml(cfg)


BAD_CONFIGS = [
    (_with("inference", kappa=0.3), "inference.kappa: must be in (0.5, 1], got 0.3"),
    (_with("source", pattern="t.*"), "source: set exactly one of topics or pattern"),
    (_with("source", topics=None), "source: set exactly one of topics or pattern"),
    (_with("model", kind="lsa"), f"model.kind: expected one of {', '.join(CONFIG_KINDS)}, got 'lsa'"),
    (_with("inference", batch_size="big"), "inference.batch_size: expected an integer, got 'big'"),
    (_with("inference", effective_batch_size=80.0),
     "inference.effective_batch_size: must be in (0, batch_size=50], got 80"),
    (_with("checkpoint", directory=None), "checkpoint.directory: required"),
    (_with("source", codec="binary").replace("n_total = 5000", 'n_total = "auto"'),
     "inference.n_total: 'auto' counts messages"),
    (_with("metrics", port=70000), "metrics.port: must be <= 65535, got 70000"),
    (dump_toml(GOOD) + "\n[modle]\nkind = 'gmm'\n", "unknown section(s) ['modle']"),
    (_with("source", group=None, grup="x"), "source: unknown setting(s) ['grup']"),
    ("[model\nkind = 'gmm'\n", "not valid TOML"),
    # keys of another model kind (issue 16): refused, naming the key and the kind
    (_with("model", n_symbols=4), "model: setting(s) ['n_symbols'] do not apply to kind = 'gmm' "
                                  "(n_symbols is for hmm)"),
    (_with("model", n_factors=2, accelerate=True),
     "do not apply to kind = 'gmm' (accelerate is for lda; n_factors is for "
     + ", ".join(k for k, cls in CONFIG_KINDS.items() if "n_factors" in cls.settings) + ")"),
    # Kafka security settings
    (_with("source", security_protocol="TLS"),
     "source.security_protocol: expected one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL, got 'TLS'"),
    (_with("source", sasl_password="hunter2"), "source.sasl_password: secrets are not read from the "
                                               "config file"),
    (_with("source", security_protocol="SASL_SSL", sasl_mechanism="PLAIN"),
     "source.sasl_username: required with security_protocol = 'SASL_SSL'"),
    (_with("source", security_protocol="SASL_SSL", sasl_mechanism="GSSAPI"),
     "source.sasl_mechanism: expected one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, got 'GSSAPI'"),
    (_with("source", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u"),
     "needs the SASL password: set sasl_password_env"),
    (_with("source", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u",
           sasl_password_env="STREAMSVI_TEST_UNSET_VAR"),
     "source.sasl_password_env: environment variable STREAMSVI_TEST_UNSET_VAR is not set"),
    (_with("source", security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN", sasl_username="u",
           sasl_password_file="no-such.pw"), "source.sasl_password_file: "),
    (_with("source", sasl_mechanism="PLAIN"), "source.sasl_mechanism: only used with security_protocol "
                                              "= SASL_PLAINTEXT or SASL_SSL, got 'PLAINTEXT'"),
    (_with("source", ssl_cafile="ca.pem"), "source.ssl_cafile: only used with security_protocol = SSL"),
    (_with("source", security_protocol="SSL", ssl_cafile="ca.pem"), "source.ssl_cafile: "),
    (_with("source", security_protocol="SSL", ssl_keyfile="k.pem"), "source.ssl_keyfile: needs ssl_certfile"),
]


@pytest.mark.parametrize("text, message", BAD_CONFIGS, ids=[m.split(":")[0][:30] for _, m in BAD_CONFIGS])
def test_bad_config_exits_2_naming_the_field(tmp_path, text, message):
    config = tmp_path / "bad.toml"
    config.write_text(text)
    proc = subprocess.run([STREAMSVI, "run", "--config", str(config), "--until-drained"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert proc.stderr.startswith("streamsvi: error: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "ck").exists()


def test_a_directory_as_config_exits_2_with_a_hint(tmp_path):
    (tmp_path / "gmm.toml").write_text(dump_toml(GOOD))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"config {tmp_path} is a directory; give a TOML file, e.g. --config {tmp_path / 'gmm.toml'}" \
        in proc.stderr


def test_print_config_refuses_a_key_of_another_model_kind(tmp_path):
    """``n_symbols`` (an hmm setting) in a gmm config was printed back as valid."""
    (tmp_path / "c.toml").write_text(_with("model", n_symbols=4))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--print-config"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "['n_symbols'] do not apply to kind = 'gmm' (n_symbols is for hmm)" in proc.stderr


@pytest.mark.parametrize("role", ["worker", "applier"])
def test_print_config_of_a_role_refuses_what_the_role_refuses(tmp_path, role):
    """``--print-config --role worker`` printed a config the worker then refused (no
    ``scaleout.deltas_topic``): the role's checks run first now."""
    (tmp_path / "c.toml").write_text(dump_toml(GOOD))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--role", role,
                           "--print-config"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == "", proc.stdout
    assert "scaleout.deltas_topic: required for --role worker/applier" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_print_config_never_shows_a_secret(tmp_path):
    secret = "s3cr3t-9f2c41"
    (tmp_path / "key.pw").write_text(secret + "\n")
    cfg = {s: dict(f) for s, f in GOOD.items()}
    cfg["source"].update(security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                         sasl_username="alice", sasl_password_env="STREAMSVI_TEST_SASL_PW")
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    env = {**os.environ, "STREAMSVI_TEST_SASL_PW": secret}
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--print-config"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    shown = json.loads(proc.stdout)["source"]
    assert shown["sasl_password_env"] == "STREAMSVI_TEST_SASL_PW" and shown["sasl_username"] == "alice"
    assert secret not in proc.stdout + proc.stderr
    cfg["source"].update(sasl_password_env=None, sasl_password_file="key.pw")   # relative to the config
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--print-config"],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["source"]["sasl_password_file"] == str(tmp_path / "key.pw")
    assert secret not in proc.stdout + proc.stderr


def test_missing_config_file_exits_2(tmp_path):
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "nope.toml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "nope.toml does not exist" in proc.stderr


def test_demo_runs_end_to_end(tmp_path):
    proc = subprocess.run([STREAMSVI, "demo", "--workdir", str(tmp_path / "demo"), "--passes", "2"],
                          capture_output=True, text=True, timeout=180)
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(r"^metrics: http://127\.0\.0\.1:\d+/metrics$", out, re.M), out
    done = re.search(r"^stopped \(drained\): (\d+) records applied, (\d+) held out", out, re.M)
    assert done, out
    # the learning table: step, ELBO/record, prequential log predictive density (each minibatch
    # before it is learned), after the start's batches
    table = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)$", out, re.M)
    assert len(table) >= 2 and int(table[0][0]) > 1, out
    assert all(np.isfinite(float(h)) for _, _, h in table), table
    assert re.search(r"^  streamsvi_prequential_loglik_smoothed -?\d", out, re.M), out
    m = re.search(r"^snapshots in (\S+); latest -> (snap-\d+), promoted -> snap-\d+$", out, re.M)
    assert m, out
    assert Path(m.group(1)) == (tmp_path / "demo" / "checkpoints").resolve()
    snap = load_snapshot(Path(m.group(1)) / m.group(2))
    assert snap.state.records_seen == int(done.group(1)) > 0
    assert int(done.group(1)) + int(done.group(2)) == 2 * 2310   # two passes of the image segments
    assert snap.config["model"]["kind"] == "gmm"


@pytest.mark.parametrize("flag", [["--until-drained"], ["--max-batches", "3"]])
def test_the_applier_refuses_stop_conditions_it_cannot_keep(tmp_path, flag):
    """Issue 30: the applier accepted --until-drained and ignored it (it ran until killed)."""
    (tmp_path / "c.toml").write_text(dump_toml(GOOD))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--role", "applier", *flag],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"streamsvi: error: {flag[0]} does not apply to --role applier" in proc.stderr


def test_an_unwritable_lambda_file_is_refused_at_start(tmp_path):
    """Issue 30: an unwritable scaleout.lambda_file directory killed the applier with a traceback
    at its first publish, not at start."""
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the directory should be")
    cfg = {**GOOD, "scaleout": {"deltas_topic": "d", "lambda_file": str(blocker / "lambda.npz")}}
    (tmp_path / "c.toml").write_text(dump_toml(cfg))
    proc = subprocess.run([STREAMSVI, "run", "--config", str(tmp_path / "c.toml"), "--role", "applier"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"streamsvi: error: scaleout.lambda_file: cannot write {blocker / 'lambda.npz'}" in proc.stderr
