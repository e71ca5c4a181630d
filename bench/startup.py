"""Start-up: from exec of ``streamsvi run`` to its first model update, and where the time goes.

Setting: a :class:`~streamsvi.io.LocalBroker` (tansu, in-memory) with a
3-partition topic holding ``--records`` GMM records (D = 8, K = 10, one JSON
record per message), produced before anything is timed. Each run is a fresh
start, as a new deployment's first run is: a new consumer group (empty at the
broker) and a new checkpoint directory, with the config the product writes
(defaults, ``batch_size`` 1000, a held-out reservoir of 500, metrics on port 0)
and ``metrics.progress_seconds`` = 0.001, so the console's first progress line
comes right after the first update.

Two kinds of run, alternated in every round (and, with ``--peer DIR``, each
also for a peer source tree, e.g. HEAD unpacked by ``git archive``, imported
through ``PYTHONPATH``):

``exec -> first update``
    the real command, ``python -m streamsvi run --config FILE``, timed from
    just before ``Popen`` to the arrival of its first ``step ...`` progress
    line on stderr (then SIGTERM: a clean stop, not timed). ``CLOCK_MONOTONIC``
    on both sides of the pipe.
``traced``
    the same command inside this script (``--child``), which times, on the
    same clock, the stages of the start: Python's own start-up (to the first
    line of the child), the imports of the command line, the config, the
    daemon's construction (model, metrics registry), its metrics server, the
    consumer's creation, the fresh-start check (a committed-offsets request),
    the group join (until partitions are assigned), the polls until the model
    has its start records, and the first update (k-means start and one SVI
    step). Module imports are timed where they happen (kafka-python, numpy,
    scipy, river, prometheus_client), by an import hook that only reads the
    clock.

``exec -> JoinGroup out`` is when the JoinGroup that the broker answers went out: at
``streamsvi run``'s early join (:class:`streamsvi.io.sources.kafka.EarlyJoin`), or, in a tree
without one, as the daemon begins to wait for its assignment. From then on the broker holds
it: tansu 0.6 in 1 s sleeps until half the session timeout has passed (1 s at 2000 ms, 5 s
at 10000 ms; a static member 3 s), Kafka for ``group.initial.rebalance.delay.ms`` (3 s by
default) when the group is empty. That hold is the floor of ``JoinGroup out -> first
update``; the start can only overlap it.

Each is done for every ``--group-settings`` pair (session timeout / heartbeat
in ms): the config's default 2000/500 (also the tests'), and 10000/3000 (the
examples' and a real Kafka cluster's, whose group.min.session.timeout.ms is
6000 by default). Medians over ``--runs`` rounds.

Run::

    python bench/startup.py                          # 5 rounds, both group settings
    python bench/startup.py --peer /tmp/head --runs 5   # the working tree against a peer tree
    python bench/startup.py --runs 1 --group-settings 2000/500   # one quick round

The tables go to stdout, progress to stderr.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

D, K = 8, 10
PARTITIONS = 3
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: modules whose import is timed in a traced run (first import only)
TIMED_MODULES = ("numpy", "scipy.special", "scipy.sparse", "kafka", "prometheus_client", "river", "sklearn",
                 "matplotlib", "streamsvi.datasets", "streamsvi.models")
#: the stages of a traced run, in the order they happen: (label, start event, end event)
STAGES = [
    ("python start-up (exec -> first line)", "spawn", "python"),
    ("imports + parse (-> run())", "python", "run"),
    ("early join: consumer made, JoinGroup out", "early_open", "early_open_end"),
    ("config (load + validate)", "load_config", "load_config_end"),
    ("import daemon, logging", "load_config_end", "daemon_init"),
    ("Daemon() (model, metrics)", "daemon_init", "daemon_init_end"),
    ("metrics server", "serve", "serve_end"),
    ("consumer created + subscribed", "open_source", "open_source_end"),
    ("fresh-start check (committed offsets)", "fresh_check", "fresh_check_end"),
    ("group join (-> partitions assigned)", "join", "join_end"),
    ("polls until the start's records", "join_end", "first_learn_update"),
    ("first update (start + SVI step)", "first_learn_update", "first_update_end"),
    ("exec -> first update", "spawn", "first_update_end"),
]


def log(msg):
    print(f"[startup {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


T0 = time.monotonic()


# ------------------------------------------------------------------ the child (traced run)
class _Timed:
    """A meta-path finder that notes when the first import of some modules starts and ends,
    and calls a hook after some modules ran (to wrap their functions)."""

    def __init__(self, marks: dict, hooks: dict):
        self.marks, self.hooks = marks, hooks

    def find_spec(self, name, path, target=None):
        if name not in self.hooks and name not in TIMED_MODULES:
            return None
        import importlib.util

        t = time.monotonic()
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run_module, marks, hook = spec.loader.exec_module, self.marks, self.hooks.get(name)

        def exec_module(module):
            run_module(module)
            if name in TIMED_MODULES:
                marks.setdefault(f"import {name}", (t, time.monotonic()))
            if hook is not None:
                hook(module)

        spec.loader.exec_module = exec_module
        return spec


def _child(argv) -> int:
    marks: dict = {"python": time.monotonic()}
    spawn, argv = float(argv[0]), argv[1:]
    marks["spawn"] = spawn

    def mark(name):
        marks.setdefault(name, time.monotonic())

    def wrap(obj, attr, start, end=None, after=None):
        fn = getattr(obj, attr)

        def wrapped(*a, **kw):
            mark(start)
            try:
                return fn(*a, **kw)
            finally:
                if end:
                    mark(end)
                if after is not None:
                    after(a[0] if a else None)
        setattr(obj, attr, wrapped)

    def hook_cli(m):
        wrap(m, "run", "run")

    def hook_config(m):
        wrap(m, "load_config", "load_config", "load_config_end")

    def hook_kafka_source(m):
        if hasattr(m, "EarlyJoin"):              # streamsvi run starts the join early
            wrap(m.EarlyJoin, "_open", "early_open", "early_open_end")

    def hook_metrics(m):
        wrap(m.DaemonMetrics, "serve", "serve", "serve_end")

    def stop_after_first(daemon):
        if "first_update_end" not in marks and daemon.state is not None and daemon.state.step >= 1:
            mark("first_update_end")
            daemon.request_stop("bench")

    def hook_daemon(m):
        D_ = m.Daemon
        wrap(D_, "__init__", "daemon_init", "daemon_init_end")
        wrap(D_, "_open_source", "open_source", "open_source_end")
        wrap(D_, "_refuse_fresh_start", "fresh_check", "fresh_check_end")
        wrap(D_, "_await_assignment", "join", "join_end")
        orig_learn = D_._learn

        def learn(self, x, source, loop):      # the _learn call that makes the first update
            t = time.monotonic()
            try:
                return orig_learn(self, x, source, loop)
            finally:
                if self.state is not None:
                    marks.setdefault("first_learn_update", t)
        D_._learn = learn
        wrap(D_, "_update", "update", None, stop_after_first)

    sys.meta_path.insert(0, _Timed(marks, {
        "streamsvi.cli": hook_cli, "streamsvi.service.config": hook_config,
        "streamsvi.io.sources.kafka": hook_kafka_source,
        "streamsvi.service.metrics": hook_metrics, "streamsvi.service.daemon": hook_daemon}))
    from streamsvi.__main__ import main

    rc = main(argv)
    out = {k: (v if isinstance(v, tuple) else v) for k, v in marks.items()}
    print("STARTUP-MARKS " + json.dumps(out), file=sys.stderr, flush=True)
    return rc


# ------------------------------------------------------------------ the parent
def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help="rounds (each: every kind, setting, tree)")
    ap.add_argument("--records", type=int, default=10_000, help="records in the topic")
    ap.add_argument("--group-settings", default="2000/500,10000/3000",
                    help="session_timeout_ms/heartbeat_interval_ms pairs, comma-separated")
    ap.add_argument("--peer", help="a peer source tree (e.g. HEAD from git archive) to time too")
    ap.add_argument("--kinds", default="exec,traced", help="exec, traced or both")
    ap.add_argument("--timeout", type=float, default=60.0, help="give up on one run after this long")
    args = ap.parse_args(argv)
    args.settings = []
    for pair in args.group_settings.split(","):
        s, h = pair.split("/")
        args.settings.append((int(s), int(h)))
    args.kinds = [k for k in args.kinds.split(",") if k]
    return args


def produce(bootstrap: str, topic: str, n: int) -> None:
    import numpy as np

    from streamsvi.datasets import make_blobs
    from streamsvi.io import JsonCodec, create_topic, produce_rows

    centers = np.random.default_rng(0).normal(0.0, 4.0, (K, D))
    X, _ = make_blobs(n, centers=centers, seed=1)
    create_topic(bootstrap, topic, partitions=PARTITIONS)
    produce_rows(bootstrap, topic, X, JsonCodec(D), partitions=PARTITIONS, timeout_s=120.0)


def write_config(path: str, bootstrap: str, topic: str, group: str, ckdir: str, n: int,
                 session_ms: int, heartbeat_ms: int) -> None:
    with open(path, "w") as f:
        f.write(f"""[model]
kind = "gmm"
n_components = {K}
n_features = {D}

[inference]
n_total = {n}

[source]
bootstrap_servers = "{bootstrap}"
topics = ["{topic}"]
group_id = "{group}"
session_timeout_ms = {session_ms}
heartbeat_interval_ms = {heartbeat_ms}

[checkpoint]
directory = "{ckdir}"

[metrics]
port = 0
progress_seconds = 0.001
""")


def run_one(kind: str, tree: str, cfg_path: str, timeout: float) -> dict:
    """One run of ``streamsvi run --config cfg_path`` from ``tree``; its times (s from spawn)."""
    env = dict(os.environ, PYTHONPATH=tree)
    if kind == "exec":
        cmd = [sys.executable, "-m", "streamsvi", "run", "--config", cfg_path]
    else:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", None, "run", "--config", cfg_path]
    lines: list = []
    got = threading.Event()
    spawn = time.monotonic()
    if kind != "exec":
        cmd[3] = repr(spawn)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env,
                            text=True, cwd=tree)
    first = {}

    def read():
        for line in proc.stderr:
            now = time.monotonic()
            lines.append(line)
            if line.startswith("step ") and "first" not in first:
                first["first"] = now - spawn
                got.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    got.wait(timeout)
    if kind == "exec":
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    reader.join(5)
    out = {"rc": proc.returncode}
    if "first" not in first:
        raise RuntimeError(f"{kind} run from {tree} printed no progress line (rc {proc.returncode}):\n"
                           + "".join(lines[-20:]))
    if kind == "exec":
        out["exec -> first update"] = first["first"]
        return out
    marks = next(json.loads(ln.split(" ", 1)[1]) for ln in lines if ln.startswith("STARTUP-MARKS "))
    for label, a, b in STAGES:
        if a in marks and b in marks:
            out[label] = marks[b] - marks[a]
    # the JoinGroup goes out at the early join (this tree) or as the daemon's wait begins (HEAD);
    # from then on the broker holds it (tansu: 1 s steps until half the session timeout)
    sent = marks.get("early_open_end", marks.get("join"))
    if sent is not None and "first_update_end" in marks:
        out["exec -> JoinGroup out"] = sent - marks["spawn"]
        out["JoinGroup out -> first update"] = marks["first_update_end"] - sent
    for mod in TIMED_MODULES:
        if f"import {mod}" in marks:
            t0, t1 = marks[f"import {mod}"]
            out[f"  import {mod} (nested)"] = t1 - t0
    return out


def table(title: str, rows: dict, trees: list) -> str:
    labels = [lbl for lbl, *_ in STAGES] + ["exec -> JoinGroup out", "JoinGroup out -> first update"] + sorted({k for r in rows.values() for k in r
                                                   if k.startswith("  import")})
    if all("exec -> first update" in k for r in rows.values() for k in r):
        labels = ["exec -> first update"]
    head = f"| {title} | " + " | ".join(trees) + " |"
    out = [head, "|---|" + "---:|" * len(trees)]
    for lbl in labels:
        cells = []
        for t in trees:
            vals = rows.get(t, {}).get(lbl)
            cells.append(f"{statistics.median(vals):.3f}" if vals else "-")
        if any(c != "-" for c in cells):
            out.append(f"| {lbl} | " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child":
        return _child(argv[1:])
    args = parse_args(argv)
    sys.path.insert(0, REPO)
    from streamsvi.io import LocalBroker

    trees = [("this tree", REPO)] + ([("peer", os.path.abspath(args.peer))] if args.peer else [])
    results: dict = {}             # (kind, setting) -> tree name -> label -> [seconds]
    with LocalBroker() as broker, tempfile.TemporaryDirectory(prefix="streamsvi-startup-") as tmp:
        topic = "startup-gmm"
        produce(broker.bootstrap, topic, args.records)
        log(f"produced {args.records} records to {topic} at {broker.bootstrap}")
        n = 0
        for rnd in range(args.runs):
            order = trees if rnd % 2 == 0 else trees[::-1]
            for (s_ms, h_ms) in args.settings:
                for kind in args.kinds:
                    for name, tree in order:
                        n += 1
                        ck = os.path.join(tmp, f"ck{n}")
                        cfg = os.path.join(tmp, f"c{n}.toml")
                        write_config(cfg, broker.bootstrap, topic, f"startup-{n}", ck, args.records,
                                     s_ms, h_ms)
                        r = run_one(kind, tree, cfg, args.timeout)
                        cell = results.setdefault((kind, f"{s_ms}/{h_ms}"), {}).setdefault(name, {})
                        for k, v in r.items():
                            if k != "rc":
                                cell.setdefault(k, []).append(v)
                        tot = r.get("exec -> first update")
                        log(f"round {rnd + 1} {kind} {s_ms}/{h_ms} {name}: exec -> first update "
                            f"{tot:.3f} s (rc {r['rc']})")
    print(f"# streamsvi start-up: seconds, median of {args.runs} (load average "
          f"{os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs)")
    names = [name for name, _ in trees]
    for (kind, setting), rows in results.items():
        print()
        print(table(f"{kind}, session/heartbeat {setting} ms", rows, names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
