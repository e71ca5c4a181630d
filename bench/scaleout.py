"""Scale-out on a local broker: records/s with 1, 2, 4 workers, the applier's ceiling, quality.

    python bench/scaleout.py [--model gmm|lda] [--records 60000] [--rounds 2] [--workers 1,2,4]
        [--batch-size 1000] [--commit-every K] [--max-staleness S]

Models (``--model``):

* ``gmm`` (default): a 5-component 8-D Gaussian mixture's draws, JSON rows, |S| = 1000, M = |S| / 4;
* ``lda``: the NYT bag-of-words corpus (8,447 documents, V = 3,012; seed 002's Table 1,
  fetched once into the cache), K = 100 topics, JSON documents, |S| = 256 (``configs/lda.toml``'s),
  plain SVI. The last 447 documents are held out; the first 8,000 are produced in
  passes (each pass in a new seeded order) until ``--records`` documents.

Runs, on one local tansu broker (memory storage), the real CLI as subprocesses:
one single-process daemon (``streamsvi run --until-drained``) and the
scale-out roles (one applier + W workers, ``--role``), alternated over
``--rounds`` rounds on the same topic (each run its own consumer group). A run's
time is from the start of its processes until every record is folded into λ
(the daemon exits drained; the applier's published λ counts every record), so
group joins are included. Then:

* the applier's ceiling: the in-process ``Applier`` on a deltas topic holding
  ``--ceiling-deltas`` committed deltas (Kafka read, decode, dedup, step,
  publication, checkpoints), in deltas/s and records/s (× records per delta);
* quality: the mean held-out log predictive density (2,000 records never
  produced) of the final λ of 4 workers and of the single daemon.

The machine's cores are shared (and with other jobs): more workers than cores
cannot run faster here; the ceiling says how far one applier goes. The bench
sees that λ holds every record on the applier's metrics endpoint (its
``streamsvi_records_seen``), not by reading the lambda topic, which would load
the broker it measures (about 1 ms of the local broker's CPU per look).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import tomllib
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model, fmt_table  # noqa: E402

_SCRIPT = Path(sys.executable).with_name("streamsvi")
#: the CLI as a user runs it: the console script, or ``python -m streamsvi`` where the package
#: is on the path but not installed
STREAMSVI = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "streamsvi"]
K, D, P = 5, 8, 4
#: the model (``--model``): "gmm" or "lda"
MODEL = "gmm"
#: LDA's setting: K topics on NYT (V words), held-out documents
LDA_K, LDA_V, LDA_HELD = 100, 3012, 447
#: every process the bench starts runs its BLAS on one thread, the single daemon as the workers
#: (N processes with a thread per core each would measure the oversubscription)
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def nyt_split():
    """(training documents, held-out documents) of NYT, CSR counts."""
    from streamsvi.datasets import load_nyt

    X, _ = load_nyt()
    return X[:-LDA_HELD], X[-LDA_HELD:]


def lda_records(n, train, seed=0):
    """``n`` documents: passes over ``train``, each in a new seeded order."""
    import scipy.sparse as sp

    rng, parts, have = np.random.default_rng(seed), [], 0
    while have < n:
        order = rng.permutation(train.shape[0])[:n - have]
        parts.append(train[order])
        have += len(order)
    return sp.vstack(parts).tocsr()


def data(n, seed=0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(K, D))
    z = rng.integers(0, K, n)
    return centres[z] + rng.normal(size=(n, D))


#: |S| (``--batch-size``; M = |S| / 4): the product's default, 1000
BATCH = 1000
#: ``scaleout`` settings of the workers and the applier (``--commit-every``, ``--max-staleness``)
SCALEOUT = {}
#: runs shorter than this many steps per worker are not held to the quality tolerance (the burn-in)
BURN_IN = 24
#: how λ reaches the workers (``--lambda``): "topic" (the default) or "file"
LAMBDA = "topic"


def applied_records(port) -> float:
    """The applier's ``streamsvi_records_seen`` from its metrics endpoint (-1 before it serves):
    how the bench sees that λ holds every record without loading the broker."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            for line in r.read().decode().splitlines():
                if line.startswith("streamsvi_records_seen "):
                    return float(line.split()[1])
    except OSError:
        pass
    return -1.0


#: the steady-state window: from the first look at which this share of the records is folded
#: into λ to the first look at which STEADY[1] is (start-up, group joins, the λ_0 proposal and
#: the drain are outside it)
STEADY = (0.2, 0.8)


class Steady:
    """CPU of the given pids (and the broker's) at the first looks past each STEADY share."""

    def __init__(self, n, pids):
        self.n, self.pids, self.marks = n, pids, []

    def look(self, seen):
        if self.n and len(self.marks) < 2 and seen >= STEADY[len(self.marks)] * self.n:
            cpu = []
            for p in self.pids:
                try:
                    cpu.append(proc_cpu(p))
                except OSError:                  # ended: its CPU is no longer readable here
                    cpu.append(float("nan"))
            self.marks.append((time.perf_counter(), seen, cpu))

    def result(self):
        """(records in the window, seconds, [CPU seconds of each pid]) or None."""
        if len(self.marks) < 2:
            return None
        (t0, r0, c0), (t1, r1, c1) = self.marks
        if r1 <= r0:                             # one look saw the whole window (a short run)
            return None
        return r1 - r0, t1 - t0, [b - a for a, b in zip(c0, c1)]


def config(work, bootstrap, topic, group, n, deltas=None, worker=None, metrics_port=None):
    from streamsvi.service.tomlw import dump_toml

    if MODEL == "lda":
        model = {"kind": "lda", "n_components": LDA_K, "n_features": LDA_V, "doc_topic_prior": 0.02,
                 "topic_word_prior": 0.02}
        inference = {"n_total": max(n, 1), "batch_size": BATCH, "max_wait_seconds": 1.0, "seed": 1}
    else:
        model = {"kind": "gmm", "n_components": K, "n_features": D, "weight_concentration": 1.0,
                 "mean_precision": 0.1, "scale": 1.0}
        inference = {"n_total": max(n, 1), "batch_size": BATCH, "effective_batch_size": BATCH // 4,
                     "max_wait_seconds": 1.0, "seed": 1}
    cfg = {"model": model, "inference": inference,
           "source": {"bootstrap_servers": bootstrap, "topics": [topic], "group_id": group,
                      "codec": "json"},
           "checkpoint": {"directory": str(work / "ck"), "every_batches": 50, "every_seconds": 5.0},
           "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0}}
    if deltas:
        # the product's staleness bound (16 versions): a worker's delta waits up to a transaction
        # (16 batches) and the other workers' transactions land in between, so with two or more
        # workers some deltas take a shortened step, as they would for a user
        cfg["scaleout"] = {"deltas_topic": deltas, **SCALEOUT}
        if LAMBDA == "file":
            cfg["scaleout"]["lambda_file"] = str(work / "ck" / "lambda.npz")
        if worker:
            cfg["scaleout"]["worker_id"] = worker
    if metrics_port is not None:
        cfg["metrics"].update(enabled=True, port=metrics_port)
    name = work / f"{worker or ('applier' if deltas else 'single')}.toml"
    name.write_text(dump_toml(cfg))
    return name


def proc_cpu(pid) -> float:
    """CPU seconds (user + system) a live process has used so far, from /proc."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def reap(p, block: bool = True) -> float | None:
    """The child ``p``'s CPU seconds (user + system, from wait4's rusage) once it has ended,
    setting ``p.returncode``; None if it runs on (``block`` False). ``p.poll()`` must not be
    used on a child passed here: it would reap it and lose the rusage."""
    pid, status, ru = os.wait4(p.pid, 0 if block else os.WNOHANG)
    if pid == 0:
        return None
    p.returncode = os.waitstatus_to_exitcode(status)
    return ru.ru_utime + ru.ru_stime


def run_single(root, bootstrap, topic, n, broker_pid):
    """(seconds, engine, state, {process: CPU seconds}) of one daemon draining the topic."""
    work = root / f"single-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    from streamsvi.io.broker import free_port

    port = free_port()                          # its progress, for the steady-state window
    cfg = config(work, bootstrap, topic, f"g-{uuid.uuid4().hex[:8]}", n, metrics_port=port)
    b0 = proc_cpu(broker_pid)
    t0 = time.perf_counter()
    with open(work / "log", "wb") as logs:
        p = subprocess.Popen([*STREAMSVI, "run", "--config", str(cfg), "--until-drained"], stdout=logs,
                             stderr=logs, env=ENV)
        steady, cpu = Steady(n, [p.pid, broker_pid]), None
        while cpu is None:                      # the same 20 looks a second as at the applier
            steady.look(applied_records(port))
            cpu = reap(p, block=False)
            time.sleep(0.05)
    el = time.perf_counter() - t0
    broker = proc_cpu(broker_pid) - b0
    assert p.returncode == 0, (work / "log").read_text()[-2000:]
    c = {"daemon": cpu, "broker": broker, "steady": _steady(steady, ["daemon", "broker"])}
    if n == 0:                                  # the start-up baseline: nothing to load
        return el, None, None, c
    from streamsvi.checkpoint import load_snapshot
    snap = load_snapshot(work / "ck")
    assert snap.state.records_seen == n, snap.state.records_seen
    return el, snap.engine, snap.state, c


def _steady(steady, names):
    """{name: µs of CPU per record, "rate": records/s} over the steady window, or None."""
    r = steady.result()
    if r is None:
        return None
    records, secs, cpus = r
    out = {"rate": records / secs}
    for name, c in zip(names, cpus):
        out[name] = out.get(name, 0.0) + 1e6 * c / records
    return out


def run_scaleout(root, bootstrap, topic, n, workers, broker_pid):
    """(seconds, engine, state, {process: CPU seconds}): an applier and ``workers`` workers."""
    from streamsvi.io.broker import create_topic
    from streamsvi.service.roles.lambda_log import LambdaLog
    from streamsvi.service.roles.transport import LambdaFile

    work = root / f"w{workers}-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    group, deltas = f"g-{uuid.uuid4().hex[:8]}", f"deltas-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, deltas, partitions=1)
    from streamsvi.io.broker import free_port

    port = free_port()
    acfg = config(work, bootstrap, topic, group, n, deltas, metrics_port=port)
    wcfgs = [config(work, bootstrap, topic, group, n, deltas, f"w{i}") for i in range(workers)]
    logs = open(work / "log", "wb")
    b0 = proc_cpu(broker_pid)
    t0 = time.perf_counter()
    procs = [subprocess.Popen([*STREAMSVI, "run", "--config", str(acfg), "--role", "applier"],
                              stdout=logs, stderr=logs, env=ENV)]
    # workers run until stopped: with --until-drained a worker whose own partitions are done asks
    # the group's committed offsets of the others (a probe round trip) at every idle turn, which
    # is not what a record costs; the CPU of every process is read when λ holds every record
    # (the empty-topic baseline uses --until-drained to end by itself)
    until = ["--until-drained"] if n == 0 else []
    procs += [subprocess.Popen([*STREAMSVI, "run", "--config", str(c), "--role", "worker", *until],
                               stdout=logs, stderr=logs, env=ENV) for c in wcfgs]
    # λ as the workers see it: the same reader (the lambda topic, or the file)
    lam = LambdaFile(work / "ck" / "lambda.npz") if LAMBDA == "file" else \
        LambdaLog(bootstrap, f"{deltas}-lambda", deltas)
    cpus = [None] * len(procs)
    steady = Steady(n, [p.pid for p in procs] + [broker_pid])
    try:
        def done():
            if n == 0:                          # the start-up baseline: the workers found nothing
                return all(c is not None for c in cpus[1:])
            seen = applied_records(port)
            steady.look(seen)
            return seen >= n

        while not done():
            for i, p in enumerate(procs):
                if cpus[i] is None:
                    cpus[i] = reap(p, block=False)
            if any(p.returncode not in (None, 0) for p in procs):
                raise RuntimeError(f"a process failed; see {work / 'log'}")
            if time.perf_counter() - t0 > 900:
                raise RuntimeError("scale-out run did not finish in 900 s")
            # (the applier's metrics endpoint, 20 looks a second: a look at the lambda topic
            # instead is a poll, about 1 ms of the local broker's CPU; at 100 a second that
            # reader alone cost it 20 ms per second, a fifth of the scale-out runs' broker figure)
            time.sleep(0.05)
        el = time.perf_counter() - t0
        broker = proc_cpu(broker_pid) - b0
        cpus = [c if c is not None else proc_cpu(p.pid) for c, p in zip(cpus, procs)]
        deadline = time.monotonic() + 60       # λ as the workers see it, once, for the quality check
        while n and not ((lam.refresh() or lam.state is not None) and lam.state.records_seen >= n):
            if time.monotonic() > deadline:
                raise RuntimeError("the applier counts every record, but λ as the workers read it does not")
            time.sleep(0.1)
    finally:
        for p in procs:
            if p.returncode is None:
                p.terminate()
        ended = [reap(p) if p.returncode is None else None for p in procs]
        cpus = [c if c is not None else e for c, e in zip(cpus, ended)]
        if hasattr(lam, "close"):
            lam.close()
    assert n == 0 or lam.state.records_seen == n, lam.state.records_seen
    return el, lam.engine, lam.state, {"applier": cpus[0], "workers": sum(cpus[1:]), "broker": broker,
                                       "steady": _steady(steady, ["applier"] + ["workers"] * workers
                                                         + ["broker"])}


def applier_ceiling(root, bootstrap, n_deltas):
    """Deltas/s of the in-process Applier over a deltas topic of ``n_deltas`` committed deltas."""
    from kafka import KafkaProducer
    from prometheus_client import CollectorRegistry

    from streamsvi.io.broker import create_topic
    from streamsvi.service.config import build_engine, validate
    from streamsvi.service.roles.applier import Applier
    from streamsvi.service.roles.transport import Delta, init_delta

    deltas = f"deltas-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, deltas, partitions=1)
    work = root / f"ceiling-{uuid.uuid4().hex[:6]}"
    work.mkdir()
    import tomllib
    cfg = validate(tomllib.loads(config(work, bootstrap, "data", f"g-{uuid.uuid4().hex[:8]}",
                                        n_deltas * BATCH, deltas).read_text()))
    engine = build_engine(cfg, n_deltas * float(BATCH))
    X = data(BATCH * 50, seed=9)
    st = engine.init(X, seed=1)
    ds = []                        # 50 different minibatches' deltas, cycled
    for j in range(50):
        tg = engine.stochastic_target(st, X[BATCH * j:BATCH * (j + 1)])
        ds.append(Delta(worker="w", version=0, ranges=[], records=BATCH,
                        stats=tg.target - engine.model.prior(), min_weight=float(tg.weights.min()),
                        n_total=engine.n_total))
    prod = KafkaProducer(bootstrap_servers=bootstrap, transactional_id=f"bench-{uuid.uuid4().hex[:6]}",
                         linger_ms=5, max_request_size=8 << 20)
    prod.init_transactions()
    prod.begin_transaction()
    prod.send(deltas, init_delta("w", engine, st).encode(), partition=0)
    for i in range(n_deltas):
        d = ds[i % len(ds)]
        d.ranges = [("data", 0, BATCH * i, BATCH * (i + 1))]
        prod.send(deltas, d.encode(), partition=0)
    prod.commit_transaction()
    prod.close()
    applier = Applier(cfg, registry=CollectorRegistry(), out=open(os.devnull, "w"))
    res = applier.run(max_deltas=n_deltas, timeout=600)
    el = time.monotonic() - res.took_over_at[0]     # from taking the partition (after the group join)
    assert res.deltas == n_deltas, res
    # pure step cost, no Kafka: decode + dedup-free apply
    from streamsvi.inference import split
    raws = [d.encode() for d in ds]
    s, t1, k = st, time.perf_counter(), 0
    while time.perf_counter() - t1 < 2.0:
        dd = Delta.decode(raws[k % len(raws)])
        s, _ = split.apply(engine, s, split.Contribution(arrays=dd.stats, records=dd.records,
                                                         min_weight=dd.min_weight, meta=dd.extra))
        k += 1
    return n_deltas / el, k / (time.perf_counter() - t1), el


def main():
    global LAMBDA, BATCH, MODEL, P
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", choices=("gmm", "lda"), default="gmm",
                    help="gmm: a 5-component 8-D mixture (default); lda: NYT, K = 100")
    ap.add_argument("--records", type=int, default=60000)
    ap.add_argument("--partitions", type=int, default=P,
                    help=f"partitions of the records topic (default {P}; at least the largest worker count, "
                         f"or some workers have none)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--ceiling-deltas", type=int, default=3000)
    ap.add_argument("--lambda", dest="lam", choices=("topic", "file"), default="topic",
                    help="how λ reaches the workers: the lambda topic (default) or a shared file")
    ap.add_argument("--commit-every", type=int, default=None,
                    help="scaleout.commit_every_batches of the workers (default: the config's)")
    ap.add_argument("--max-staleness", type=int, default=None,
                    help="scaleout.max_staleness of the applier (default: the config's)")
    ap.add_argument("--scaleout", action="append", default=[], metavar="KEY=VALUE",
                    help="any other [scaleout] setting of the workers and applier, e.g. "
                         "compact_below=0 or publish_seconds=1 (repeatable; a TOML value)")
    ap.add_argument("--batch-size", type=int, default=None,
                    help=f"|S| of every run (gmm: M = |S| / 4; default gmm {BATCH}, the product's "
                         f"default; lda 256, configs/lda.toml's)")
    args = ap.parse_args()
    MODEL = args.model
    P = args.partitions
    LAMBDA = args.lam
    BATCH = args.batch_size or (256 if MODEL == "lda" else BATCH)
    if args.commit_every is not None:
        SCALEOUT["commit_every_batches"] = args.commit_every
    if args.max_staleness is not None:
        SCALEOUT["max_staleness"] = args.max_staleness
    for item in args.scaleout:
        key, _, value = item.partition("=")
        SCALEOUT[key.strip()] = tomllib.loads(f"v = {value.strip()}")["v"]
    from streamsvi.io import JsonCodec, produce_rows
    from streamsvi.io.broker import LocalBroker, create_topic

    from streamsvi.io.bow import BowJsonCodec
    from streamsvi.io.records import KINDS

    n = args.records
    if MODEL == "lda":
        train, H = nyt_split()
        X, codec, kind = lda_records(n, train), BowJsonCodec(LDA_V), KINDS["bow"]
        what = (f"{n} JSON documents (NYT, {train.shape[0]} documents in passes, V = {LDA_V}) for "
                f"LDA K = {LDA_K}")
    else:
        X, H = data(n, seed=0), data(2000, seed=0)[::-1]   # H: same clusters, never produced
        rng = np.random.default_rng(1)
        H = H + rng.normal(scale=0.01, size=H.shape)
        codec, kind = JsonCodec(D), KINDS["dense"]
        what = f"{n} JSON records of a {K}-component {D}-D mixture"
    counts = [int(w) for w in args.workers.split(",")]
    print(f"cpu: {cpu_model()}, {os.cpu_count()} cores (shared with other jobs: absolute speeds are noisy)")
    with LocalBroker() as broker, tempfile.TemporaryDirectory(prefix="scaleout-bench-") as tmp:
        root, bs = Path(tmp), broker.bootstrap
        topic = f"points-{uuid.uuid4().hex[:6]}"
        create_topic(bs, topic, partitions=P)
        t_prod = time.perf_counter()
        produce_rows(bs, topic, X, codec, partitions=P, kind=kind)
        m = f", M {BATCH // 4}" if MODEL == "gmm" else ", plain SVI"
        print(f"{what} on {P} partitions (produced in {time.perf_counter() - t_prod:.0f} s); batch {BATCH}{m}; "
              f"every process's BLAS on one thread\n", flush=True)
        # start-up CPU (imports, group join, shutdown) of each role on an empty topic, subtracted
        # below so that "CPU per record" is what each record costs
        empty = f"empty-{uuid.uuid4().hex[:6]}"
        create_topic(bs, empty, partitions=P)
        _, _, _, c0 = run_single(root, bs, empty, 0, broker.proc.pid)
        _, _, _, c1 = run_scaleout(root, bs, empty, 0, 1, broker.proc.pid)
        start_cpu = {"daemon": c0["daemon"], "workers": c1["workers"], "applier": c1["applier"],
                     "broker": 0.0}
        print(f"start-up CPU on an empty topic: daemon {c0['daemon']:.2f} s, worker {c1['workers']:.2f} s, "
              f"applier {c1['applier']:.2f} s (subtracted below)\n")
        times = {"single": [], **{w: [] for w in counts}}
        cpu = {"single": [], **{w: [] for w in counts}}
        quality = {"single": [], **{w: [] for w in counts}}     # held-out figure of each round
        steps = {"single": [], **{w: [] for w in counts}}
        bpid = broker.proc.pid
        for r in range(args.rounds):
            order = ["single"] + counts if r % 2 == 0 else counts[::-1] + ["single"]
            for what in order:
                if what == "single":
                    el, eng, state, c = run_single(root, bs, topic, n, bpid)
                else:
                    el, eng, state, c = run_scaleout(root, bs, topic, n, what, bpid)
                times[what].append(el)
                cpu[what].append(c)
                quality[what].append(heldout(eng, state, H))
                steps[what].append(state.step)
                print(f"  round {r + 1}: {what if what == 'single' else f'{what} worker(s)':>12}  "
                      f"{el:6.1f} s  {n / el:8.0f} rec/s  held-out {quality[what][-1]:.4f}", flush=True)
        base = np.median(times["single"])
        rows = [["single process", f"{np.median(times['single']):.1f}", f"{n / base:.0f}", "1.00"]]
        for w in counts:
            t = np.median(times[w])
            rows.append([f"{w} worker(s) + applier", f"{t:.1f}", f"{n / t:.0f}", f"{base / t:.2f}"])
        print("\nthroughput (median of rounds; time includes process start and group joins):")
        print(fmt_table(["run", "seconds", "records/s", "vs single"], rows))

        print("\nCPU per record (µs; median of rounds; each process from its start to its end, the "
              "broker over the run):")
        def us(what, key):
            per = {"workers": what if what != "single" else 1}.get(key, 1)
            return 1e6 * float(np.median([c[key] - per * start_cpu[key] for c in cpu[what]])) / n
        d_us, db_us = us("single", "daemon"), us("single", "broker")
        rows = [["single process", f"{d_us:.1f}", "", "", f"{db_us:.2f}", "1.00", "1.00"]]
        for w in counts:
            w_us, b_us = us(w, "workers"), us(w, "broker")
            rows.append([f"{w} worker(s) + applier", "", f"{w_us:.1f}", f"{us(w, 'applier'):.1f}",
                         f"{b_us:.2f}", f"{w_us / d_us:.2f}", f"{b_us / db_us:.2f}"])
        print(fmt_table(["run", "daemon", "workers (all)", "applier", "broker", "workers/daemon",
                         "broker/broker(single)"], rows))

        print(f"\nsteady state (µs of CPU per record and records/s, median of rounds, from the look at "
              f"which {STEADY[0]:.0%} of the records were folded into λ to the one at {STEADY[1]:.0%}: "
              f"no start-up, group join or drain):")

        def st(what, key):
            v = [c["steady"][key] for c in cpu[what] if c.get("steady")]
            return float(np.median(v)) if v else float("nan")

        def ratio(a, b):
            return f"{a / b:.2f}" if b > 0 else "n/a"
        d_us, db_us, d_rate = st("single", "daemon"), st("single", "broker"), st("single", "rate")
        rows = [["single process", f"{d_rate:.0f}", "1.00", f"{d_us:.1f}", "", "", f"{db_us:.2f}", "1.00",
                 "1.00"]]
        for w in counts:
            w_us, b_us, rate = st(w, "workers"), st(w, "broker"), st(w, "rate")
            rows.append([f"{w} worker(s) + applier", f"{rate:.0f}", ratio(rate, d_rate), "", f"{w_us:.1f}",
                         f"{st(w, 'applier'):.1f}", f"{b_us:.2f}", ratio(w_us, d_us), ratio(b_us, db_us)])
        print(fmt_table(["run", "records/s", "vs single", "daemon", "workers (all)", "applier", "broker",
                         "workers/daemon", "broker/broker(single)"], rows))

        if MODEL == "lda":
            print("\napplier ceiling: for LDA see bench/applier_ceiling.py (the step alone)")
        else:
            dps, pure, el = applier_ceiling(root, bs, args.ceiling_deltas)
            print(f"\napplier ceiling: {dps:.0f} deltas/s end to end ({args.ceiling_deltas} deltas read "
                  f"read_committed, decoded, applied, published, checkpointed in {el:.1f} s) = "
                  f"{dps * BATCH:.0f} records/s at {BATCH} records per delta; the step alone (decode + apply): "
                  f"{pure:.0f} deltas/s = {pure * BATCH:.0f} records/s")

        if MODEL == "lda":
            unit, tol = "nats/word", 0.02
            print(f"\nquality: held-out per-word bound ({H.shape[0]} NYT documents not trained on, "
                  f"{unit}; Σ_d L_d / Σ_d N_d):")
        else:
            unit, tol = "nats/record", 0.05
            print(f"\nquality: mean held-out log predictive density ({H.shape[0]} records not trained "
                  f"on, {unit}):")
        # every round's figure: the same stream each round, so the spread is what the timing of
        # the processes (which deltas land at which version) makes of it, the single daemon's own
        # (partial batches at max_wait_seconds) included
        rows = []
        for what in ["single"] + counts:
            q = np.array(quality[what])
            sd = f"{q.std(ddof=1):.4f}" if len(q) > 1 else "-"
            rows.append([what if what == "single" else f"{what} worker(s)", f"{q.mean():.4f}", sd,
                         f"{q.min():.4f}", f"{q.max():.4f}", f"{np.median(steps[what]):.0f}"])
        print(fmt_table(["run", "held-out (mean of rounds)", "sd", "min", "max", "steps"], rows))
        # N workers' first N·k deltas are all computed at λ_0 (k batches per transaction) and
        # spend the schedule's largest steps: a burn-in that a run of fewer than BURN_IN·N steps
        # has not worked off (docs/scale-out.md, "Quality"); such a run is reported, not judged
        ref = float(np.mean(quality["single"]))
        for w in counts:
            d, t = float(np.mean(quality[w])) - ref, float(np.median(steps[w]))
            if t < BURN_IN * w:
                verdict = f"not judged: {t:.0f} steps < {BURN_IN}·{w}, the burn-in"
            else:
                verdict = ("within" if d >= -tol else "OUTSIDE") + f" the tolerance (not worse than single − {tol})"
            print(f"{w} worker(s) vs single, means of rounds: {d:+.4f} {unit}; {verdict}")


def heldout(eng, state, H) -> float:
    """The held-out figure of one run: LDA's per-word bound, else the mean log predictive density."""
    ll = eng.predictive_logpdf(state, H)
    return float(np.sum(ll) / H.sum()) if MODEL == "lda" else float(np.mean(ll))

if __name__ == "__main__":
    main()
