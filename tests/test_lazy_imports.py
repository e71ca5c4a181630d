"""Start-up: the command line imports what a command needs, when it needs it, and
``streamsvi run`` starts its group join before the heavy imports.

``streamsvi run`` pays for every module it imports before its first update
(bench/startup.py times the start), so the modules only other commands use are
imported by those commands: numpy, the models and the engine by ``compare``,
``demo``, ``inspect`` and ``produce``; the data sets by ``compare`` and
``produce --dataset``; matplotlib by ``report`` and ``compare --plot``. Each
check runs in a fresh interpreter, so what an earlier test imported does not
count.

The early join (:class:`streamsvi.io.sources.kafka.EarlyJoin`) is checked against the
shared local broker: the source with the same settings takes the consumer over and reads
every record from where it should (nothing is read before the take-over, a seek made
before the assignment holds), a source with other settings does not, and an early join
no source took is released without wedging the group.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest_broker import kafka_broker, new_group, new_topic  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]

#: never needed by `import streamsvi.cli` alone: the command line is parsed first
HEAVY = ("numpy", "scipy", "kafka", "prometheus_client", "river", "sklearn", "matplotlib",
         "streamsvi.models", "streamsvi.inference", "streamsvi.datasets", "streamsvi.io")
#: never needed by `streamsvi run` up to its validated config (--print-config)
NOT_FOR_RUN = ("streamsvi.datasets", "streamsvi.compare", "streamsvi.scoring", "matplotlib",
               "sklearn", "river", "pandas", "kafka", "prometheus_client")


def _modules_after(code: str) -> set[str]:
    """The names in ``sys.modules`` after ``code`` ran in a fresh interpreter."""
    script = code + "\nimport json, sys\nprint('MODULES ' + json.dumps(sorted(sys.modules)))\n"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p])}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("MODULES "))
    return set(json.loads(line[len("MODULES "):]))


def test_importing_the_cli_loads_nothing_heavy():
    loaded = _modules_after("import streamsvi.cli")
    assert not {m for m in HEAVY if m in loaded}


def test_importing_the_package_and_its_entry_point_loads_nothing_heavy():
    loaded = _modules_after("import streamsvi, streamsvi.__main__")
    assert not {m for m in HEAVY if m in loaded}


def test_run_up_to_its_config_imports_only_what_a_run_needs(tmp_path):
    config = tmp_path / "gmm.toml"
    config.write_text('[model]\nkind = "gmm"\nn_components = 3\nn_features = 2\n\n'
                      '[inference]\nn_total = 1000\n\n[source]\ntopics = ["t"]\n\n'
                      f'[checkpoint]\ndirectory = {json.dumps(str(tmp_path / "ck"))}\n')
    loaded = _modules_after(
        "import contextlib, io\nfrom streamsvi.__main__ import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['run', '--config', {str(config)!r}, '--print-config']) == 0\n")
    assert "streamsvi.service.config" in loaded         # the check ran the path it means to
    assert not {m for m in NOT_FOR_RUN if m in loaded}


# ------------------------------------------------------------------ the early group join
def _rows(n):
    return np.column_stack([np.arange(n, dtype=float), np.zeros(n)])


def _read_all(src, n, max_wait_s=0.5):
    got = {}
    deadline = time.monotonic() + 30
    while sum(len(v) for v in got.values()) < n and time.monotonic() < deadline:
        b = src.poll_batch(100, max_wait_s)
        if b is None:
            continue
        for i in b.x[:, 0].astype(int):
            got.setdefault(int(i) % 3, []).append(int(i))
    return got


@pytest.fixture
def early_joins():
    from streamsvi.io.sources import kafka as kafka_source

    yield kafka_source
    kafka_source.release_early_joins(wait_s=5.0)


@pytest.mark.parametrize("joined_first", [False, True], ids=["join-in-flight", "join-done"])
def test_the_source_with_the_same_settings_takes_the_early_consumer_over(kafka_broker, new_topic,
                                                                         new_group, early_joins,
                                                                         joined_first):
    from streamsvi.io import JsonCodec, KafkaSource, produce_rows

    topic, group, N = new_topic(3), new_group(), 90
    produce_rows(kafka_broker.bootstrap, topic, _rows(N), JsonCodec(2), partitions=3)
    early = early_joins.start_early_join(kafka_broker.bootstrap, [topic], group_id=group)
    assert early.consumer is not None
    if joined_first:                                    # the thread's poll completed the join
        deadline = time.monotonic() + 15
        while not early.consumer.assignment() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert early.consumer.assignment()
    with KafkaSource(kafka_broker.bootstrap, [topic], group_id=group, codec=JsonCodec(2)) as src:
        assert src.consumer is early.consumer and not early_joins._EARLY
        src.seek({(topic, 1): 10})                     # a resumed checkpoint's offsets
        keys = {(topic, p) for p in range(3)}
        assert src.wait_for_assignment(15) == keys
        assert src.positions() == {(topic, 0): 0, (topic, 1): 10, (topic, 2): 0}
        got = _read_all(src, N - 10)
    assert got[0] == list(range(0, N, 3)) and got[2] == list(range(2, N, 3))
    assert got[1] == list(range(31, N, 3))              # from the sought offset 10 on


def test_a_source_with_other_settings_makes_its_own_and_the_group_is_not_wedged(
        kafka_broker, new_topic, new_group, early_joins):
    from streamsvi.io import JsonCodec, KafkaSource

    topic, group = new_topic(2), new_group()
    early = early_joins.start_early_join(kafka_broker.bootstrap, [topic], group_id=group,
                                         session_timeout_ms=3000, heartbeat_interval_ms=500)
    with KafkaSource(kafka_broker.bootstrap, [topic], group_id=group, codec=JsonCodec(2),
                     session_timeout_ms=2000) as src:
        assert src.consumer is not early.consumer
        assert len(early_joins._EARLY) == 1
        early_joins.release_early_joins(wait_s=5.0)   # its join is finished, then it leaves
        assert early.consumer is None
        assert src.wait_for_assignment(20) == {(topic, 0), (topic, 1)}


def test_run_starts_the_join_its_daemon_source_takes_over(kafka_broker, new_topic, new_group,
                                                           early_joins, tmp_path):
    from prometheus_client import CollectorRegistry

    from streamsvi import cli
    from streamsvi.service import daemon
    from streamsvi.service.config import load_config
    from streamsvi.service.metrics import DaemonMetrics

    assert cli._EARLY_JOIN_CONNECT_TIMEOUT_S == daemon.CONNECT_TIMEOUT_S
    topic, group = new_topic(1), new_group()
    config = tmp_path / "gmm.toml"
    config.write_text('[model]\nkind = "gmm"\nn_components = 2\nn_features = 2\n\n'
                      '[inference]\nn_total = 100\n\n'
                      f'[source]\nbootstrap_servers = "{kafka_broker.bootstrap}"\ntopics = ["{topic}"]\n'
                      f'group_id = "{group}"\n\n'
                      f'[checkpoint]\ndirectory = {json.dumps(str(tmp_path / "ck"))}\n')
    assert cli._start_early_join(config)
    (early,) = early_joins._EARLY.values()
    src = daemon.default_source(load_config(config), DaemonMetrics(CollectorRegistry()))
    try:
        assert src.consumer is early.consumer and not early_joins._EARLY
        assert src.wait_for_assignment(15) == {(topic, 0)}
    finally:
        src.close()


def test_no_early_join_without_a_broker_that_answers_or_for_a_pattern(tmp_path, early_joins):
    from streamsvi import cli
    from streamsvi.io.broker import free_port

    config = tmp_path / "c.toml"
    config.write_text(f'[source]\nbootstrap_servers = "127.0.0.1:{free_port()}"\ntopics = ["t"]\n')
    assert cli._start_early_join(config)                # started; it made no consumer
    (early,) = early_joins._EARLY.values()
    assert early.consumer is None and early.take() is None
    config.write_text('[source]\npattern = "t.*"\n')
    assert not cli._start_early_join(config)
    config.write_text('[source]\ntopics = ["t"]\nsecurity_protocol = "SSL"\n')
    assert not cli._start_early_join(config)
