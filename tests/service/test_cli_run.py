"""The command line as a user meets it: ``streamsvi run`` with bad configs, ``streamsvi demo``."""
import re
import subprocess
from pathlib import Path

import pytest

from streamsvi.checkpoint import load_snapshot

from .conftest import STREAMSVI, gmm_config, to_toml

#: A valid config (relative checkpoint directory: next to the config file); each case breaks one thing.
GOOD = gmm_config(Path("."), bootstrap="127.0.0.1:9", topic="t", group="g", checkpoint={"directory": "ck"})


def _with(section, **changes):
    cfg = {s: dict(f) for s, f in GOOD.items()}
    for k, v in changes.items():
        if v is None:
            cfg[section].pop(k, None)
        else:
            cfg[section][k] = v
    return to_toml(cfg)


BAD_CONFIGS = [
    (_with("inference", kappa=0.3), "inference.kappa: must be in (0.5, 1], got 0.3"),
    (_with("source", pattern="t.*"), "source: set exactly one of topics or pattern"),
    (_with("source", topics=None), "source: set exactly one of topics or pattern"),
    (_with("model", kind="lsa"), "model.kind: expected one of gmm, gmm_dp, gauss1d, hmm, lda, pmf, got 'lsa'"),
    (_with("inference", batch_size="big"), "inference.batch_size: expected an integer, got 'big'"),
    (_with("inference", effective_batch_size=80.0),
     "inference.effective_batch_size: must be in (0, batch_size=50], got 80"),
    (_with("checkpoint", directory=None), "checkpoint.directory: required"),
    (_with("source", codec="binary").replace("n_total = 5000", 'n_total = "auto"'),
     "inference.n_total: 'auto' counts messages"),
    (_with("metrics", port=70000), "metrics.port: must be <= 65535, got 70000"),
    (to_toml(GOOD) + "\n[modle]\nkind = 'gmm'\n", "unknown section(s) ['modle']"),
    (_with("source", group=None, grup="x"), "source: unknown setting(s) ['grup']"),
    ("[model\nkind = 'gmm'\n", "not valid TOML"),
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
    # the learning table: step, ELBO/record, held-out log-likelihood; held-out rises
    table = re.findall(r"^\s*(\d+)\s+(-?\d+\.\d+)\s+(-?\d+\.\d+)$", out, re.M)
    assert len(table) >= 2, out
    heldout = [float(h) for _, _, h in table]
    assert heldout[-1] > heldout[0], table
    m = re.search(r"^snapshots in (\S+); latest -> (snap-\d+)$", out, re.M)
    assert m, out
    assert Path(m.group(1)) == (tmp_path / "demo" / "checkpoints").resolve()
    snap = load_snapshot(Path(m.group(1)) / m.group(2))
    assert snap.state.records_seen == int(done.group(1)) > 0
    assert int(done.group(1)) + int(done.group(2)) == 2 * 768          # two passes of Pima
    assert snap.config["model"]["kind"] == "gmm"
