"""End-to-end throughput (records/s) of the daemon through a Kafka broker, against its parts
and against confluent-kafka's reader, on plain and compressed topics, GMM and LDA.

Workloads (``--workloads``):

``gmm-json``, ``gmm-binary``
    Bayesian GMM, D = 8, K = 10; records drawn from a 10-component Gaussian mixture in 8-D
    (fixed seed). JSON: one record per message (``[x_1, ..., x_8]``); binary: 1000 float64
    rows per message (``BinaryBatchCodec``). |S| = 1000 (``--batch-size``).
``lda-json``, ``lda-binary``
    LDA, K = 50, on the NYT bag of words (seed 002 Table 1: the 7,603 training documents of
    ``bench/lda_nyt.py``'s split, V = 3,012), three passes in corpus order (22,809
    documents): the whole run the issue asks about. JSON: ``{"ids": [...], "counts": [...]}``
    per message; binary: one CSR minibatch of 256 documents per message
    (``BowBinaryCodec``). |S| = 256, the local step of ``configs/lda.toml``.

Each workload's records are produced to one 3-partition topic per compression
(``--compressions``: none, lz4, zstd, gzip, snappy; kafka-python's producer,
``compression_type``), on a :class:`~streamsvi.io.LocalBroker` (tansu, 127.0.0.1,
in-memory), *before* anything is timed. Then in rounds (``--repeats``; in each round every
topic, and for each topic every stage in turn, so the stages see the same machine load),
each stage in its own consumer group so each reads the whole topic:

``confluent-kafka, bare``
    ``confluent_kafka.Consumer.consume(10000)`` in a loop that counts the messages (the
    peer: librdkafka's reader). The bare readers are timed steady: from the first messages
    a poll returns to the last, the rate over the messages after the first poll's. Same group settings as streamsvi's (session 2000 ms,
    heartbeat 500 ms, fetch sizes 16 MiB per partition / 64 MiB).
``kafka-python reader, bare`` / ``lean reader, bare``
    ``KafkaConsumer.poll`` handing out every message, with kafka-python's own record
    parser and with the lean reader ``KafkaSource`` installs
    (:mod:`streamsvi.io._fastfetch`).
``source only``
    ``KafkaSource.poll_batch`` (fetch, lean reader, decode, validate; no model) until every
    record is read: the bare fast reader with decoding.
``daemon``
    the real :class:`~streamsvi.service.daemon.Daemon` in-process (config through
    ``streamsvi.service.config.validate``, metrics served on port 0, a checkpoint every 2
    s, no held-out reservoir), ``run(until_drained=True)``. Whole run: from the call to its
    return (metrics server, group join, every batch, checkpoints, the drained check).
    Steady: from the first batch handed out to the end of the last update, every record
    of the run counted (the first batch's records too, so the rate is conservative).
``daemon, source.prefetch = true``
    the same reading each next minibatch in a background thread while the last one is
    learned (:mod:`streamsvi.io.sources.prefetch`; off by default).

and, once per workload, ``engine in memory``: the same engine (``build_engine`` from the
same config) on the decoded records in minibatches of |S|, no I/O. GMM: ``SVI.update`` on
50 pre-made batches for 3 windows of ``--engine-seconds`` (best and median). LDA: the whole
run (``init`` on the first minibatch, then ``update`` over the three passes), timed once
per round.

Goals (issue 27), printed at the end as ratios from the same run:

* daemon steady ≥ 0.8 × min(source only, engine in memory), per workload and compression;
* LDA: daemon whole run ≥ 0.8 × the engine's whole run;
* a compressed topic at the speed of the plain one (daemon steady, compressed / none).

``OPENBLAS_NUM_THREADS=1`` (set below before numpy is imported): the update's matrices
are small; BLAS threads cost more than they save on a 2-core machine where the broker
needs a core.

Run::

    python bench/e2e_throughput.py                 # everything, 3 rounds (~15 min on 2 cores)
    python bench/e2e_throughput.py --quick         # fewer records, 1 round, lz4 only (~3 min)
    python bench/e2e_throughput.py --workloads lda-json --compressions none --stages source,daemon
    python bench/e2e_throughput.py --workloads gmm-json --profile      # + cProfile of the daemon

The table goes to stdout, progress to stderr. confluent-kafka is optional (``pip install
confluent-kafka``); without it that stage is left out.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import cProfile  # noqa: E402
import io  # noqa: E402
import platform  # noqa: E402
import pstats  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
from _common import blas_build, cpu_model, fmt_table  # noqa: E402  (bench/ sibling)

D, K = 8, 10                    # GMM
LDA_K, LDA_BATCH, LDA_PASSES = 50, 256, 3
PARTITIONS = 3
WORKLOADS = ("gmm-json", "gmm-binary", "lda-json", "lda-binary")
COMPRESSIONS = ("none", "lz4", "zstd", "gzip", "snappy")
STAGES = ("confluent", "stock", "lean", "source", "daemon", "daemon-prefetch")
STAGE_NAMES = {"confluent": "confluent-kafka, bare", "stock": "kafka-python reader, bare",
               "lean": "lean reader, bare", "source": "source only (decode + validate)",
               "daemon": "daemon", "daemon-prefetch": "daemon, source.prefetch = true"}
T0 = time.monotonic()


def log(msg):
    print(f"[e2e {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="100k GMM JSON / 1M binary records, one LDA pass, 1 round, none+lz4")
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help=f"comma list of {WORKLOADS}")
    ap.add_argument("--compressions", default=None,
                    help=f"comma list of {COMPRESSIONS} (default all; --quick none,lz4)")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {STAGES}")
    ap.add_argument("--json-records", type=int, default=None, help="GMM JSON records (300 000)")
    ap.add_argument("--binary-records", type=int, default=None, help="GMM binary records (3 000 000)")
    ap.add_argument("--lda-passes", type=int, default=None, help=f"passes over NYT ({LDA_PASSES})")
    ap.add_argument("--message-rows", type=int, default=1000, help="rows per binary GMM message")
    ap.add_argument("--batch-size", type=int, default=1000, help="GMM |S|")
    ap.add_argument("--repeats", type=int, default=None, help="rounds (default 3; --quick 1)")
    ap.add_argument("--max-wait", type=float, default=0.5, help="inference.max_wait_seconds")
    ap.add_argument("--engine-seconds", type=float, default=1.0,
                    help="GMM: length of one timed engine window; best of 3")
    ap.add_argument("--profile", action="store_true", help="cProfile the daemon runs (stderr)")
    args = ap.parse_args(argv)

    def names(value, allowed, what):
        out = [v.strip() for v in value.split(",") if v.strip()]
        bad = [v for v in out if v not in allowed]
        if bad or not out:
            ap.error(f"--{what}: {bad or value!r} not among {allowed}")
        return out

    args.workloads = names(args.workloads, WORKLOADS, "workloads")
    args.compressions = names(args.compressions or ("none,lz4" if args.quick else ",".join(COMPRESSIONS)),
                              COMPRESSIONS, "compressions")
    args.stages = names(args.stages, STAGES, "stages")
    args.json_records = args.json_records or (100_000 if args.quick else 300_000)
    args.binary_records = args.binary_records or (1_000_000 if args.quick else 3_000_000)
    args.lda_passes = args.lda_passes or (1 if args.quick else LDA_PASSES)
    args.repeats = args.repeats or (1 if args.quick else 3)
    if "confluent" in args.stages:
        try:
            import confluent_kafka  # noqa: F401
        except ImportError:
            log("confluent-kafka is not installed: its stage is left out (pip install confluent-kafka)")
            args.stages.remove("confluent")
    return args


# ----------------------------------------------------------------- machine
def machine_info() -> list[str]:
    import kafka

    try:
        import confluent_kafka
        ck = f"confluent-kafka {confluent_kafka.version()[0]} (librdkafka {confluent_kafka.libversion()[0]})"
    except ImportError:
        ck = "confluent-kafka not installed"
    aff = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return [f"CPU: {cpu_model()}; logical CPUs {os.cpu_count()} (usable {aff}); load average "
            f"{os.getloadavg()[0]:.2f} at the end",
            f"Python {platform.python_version()}, numpy {np.__version__} (BLAS {blas_build()}), "
            f"kafka-python {kafka.__version__}, {ck}",
            "env: " + " ".join(f"{v}={os.environ.get(v)}" for v in
                               ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"))]


def proc_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (Linux), or nan."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return float("nan")


# -------------------------------------------------------------------- data
class Workload:
    """One model and codec: its records, how they are produced, its config."""

    def __init__(self, name: str, args):
        self.name, self.args = name, args
        self.model, self.codec = name.split("-")
        if self.model == "gmm":
            from streamsvi.datasets import make_blobs

            n = args.json_records if self.codec == "json" else args.binary_records
            centers = np.random.default_rng(0).normal(0.0, 4.0, (K, D))
            self.X = make_blobs(n, centers=centers, seed=1)[0]
            self.n, self.batch = n, args.batch_size
        else:
            import scipy.sparse as sp

            from streamsvi.datasets import load_nyt

            X = load_nyt()[0]
            train = X[np.random.default_rng(0).permutation(X.shape[0])[:7603]]  # lda_nyt.py's split
            self.X = sp.vstack([train] * args.lda_passes).tocsr()
            self.n, self.batch = self.X.shape[0], LDA_BATCH
        self.n_messages = None

    def codec_obj(self):
        from streamsvi.io import BinaryBatchCodec, JsonCodec
        from streamsvi.io.bow import BowBinaryCodec, BowJsonCodec

        V = self.X.shape[1]
        return {("gmm", "json"): lambda: JsonCodec(D), ("gmm", "binary"): lambda: BinaryBatchCodec(D),
                ("lda", "json"): lambda: BowJsonCodec(V),
                ("lda", "binary"): lambda: BowBinaryCodec(V)}[(self.model, self.codec)]()

    def produce(self, bootstrap: str, topic: str, compression: str) -> int:
        from streamsvi.io import create_topic, produce_rows
        from streamsvi.io.records import KINDS

        create_topic(bootstrap, topic, partitions=PARTITIONS)
        codec = self.codec_obj()
        rows = None if codec.rows_per_message == 1 else \
            (self.args.message_rows if self.model == "gmm" else LDA_BATCH)
        conf = {"linger_ms": 20, "batch_size": 1 << 20}
        if compression != "none":
            conf["compression_type"] = compression
        return produce_rows(bootstrap, topic, self.X, codec, batch_rows=rows, partitions=PARTITIONS,
                            timeout_s=900.0, producer_config=conf,
                            kind=KINDS["bow"] if self.model == "lda" else None)

    def config(self, bootstrap: str, topic: str, ckdir: str, group: str, prefetch: bool = False) -> dict:
        from streamsvi.service.config import validate

        if self.model == "gmm":
            model = {"kind": "gmm", "n_components": K, "n_features": D, "weight_concentration": 0.5,
                     "mean_precision": 0.1, "scale": 1.0}
            inference = {"n_total": self.n, "batch_size": self.batch}
        else:
            model = {"kind": "lda", "n_components": LDA_K, "n_features": self.X.shape[1],
                     "doc_topic_prior": 0.02, "topic_word_prior": 0.02, "max_doc_update_iter": 100,
                     "mean_change_tol": 1e-3, "init": "gamma"}
            inference = {"n_total": 7603, "batch_size": self.batch, "tau0": 10.0, "kappa": 0.7}
        return validate({
            "model": model,
            "inference": {**inference, "max_wait_seconds": self.args.max_wait, "seed": 0},
            "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic],
                       "group_id": group, "codec": self.codec, "connect_attempts": 3,
                       "prefetch": prefetch},
            "validation": {"max_message_bytes": 16 << 20},
            "checkpoint": {"directory": ckdir, "every_seconds": 2.0, "every_batches": 1_000_000,
                           "keep": 2},
            "metrics": {"enabled": True, "port": 0, "heldout_size": 0, "progress_seconds": 2.0},
        })


# ------------------------------------------------------------------ stages
def engine_gmm(cfg: dict, X: np.ndarray, batch: int, window_s: float) -> tuple[float, float]:
    """(best, median) records/s of ``SVI.update`` on pre-made batches, 3 windows."""
    from streamsvi.service.config import build_engine

    engine = build_engine(cfg, float(cfg["inference"]["n_total"]))
    n_b = max(1, min(50, len(X) // batch))
    batches = [np.ascontiguousarray(X[i * batch:(i + 1) * batch]) for i in range(n_b)]
    state = engine.init(batches[0], seed=0)
    for i in range(5):                                       # warm-up
        state, _ = engine.update(state, batches[i % n_b])
    rates = []
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while True:
            state, _ = engine.update(state, batches[n % n_b])
            n += 1
            el = time.perf_counter() - t0
            if el >= window_s:
                break
        rates.append(n * batch / el)
    return max(rates), statistics.median(rates)


def engine_lda_whole(cfg: dict, X) -> float:
    """Seconds of the engine's whole run over ``X`` in minibatches of |S|, corpus order."""
    from streamsvi.service.config import build_engine

    S = cfg["inference"]["batch_size"]
    t0 = time.perf_counter()
    engine = build_engine(cfg, float(cfg["inference"]["n_total"]))
    state = engine.init(X[:S], seed=0)
    for i in range(0, X.shape[0], S):
        state, _ = engine.update(state, X[i:i + S])
    return time.perf_counter() - t0


def _steady_seconds(t0, first: int, n: int) -> float:
    """Seconds a bare reader would take for all ``n`` messages at its steady rate: the time
    since ``t0`` (when the first poll's ``first`` messages came) over the ``n - first`` after
    them; nan when the first poll brought everything (or none came)."""
    if t0 is None or first >= n:
        return float("nan")
    return (time.perf_counter() - t0) * n / (n - first)


def _seconds_left(t0, got, n, what):
    if time.perf_counter() - t0 > 900:
        raise RuntimeError(f"{what} read only {got} of {n} messages in 900 s")


def bare_confluent(bootstrap: str, topic: str, n_messages: int, group: str) -> float:
    """Seconds for ``confluent_kafka.Consumer.consume(10000)`` to hand out ``n_messages``."""
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "session.timeout.ms": 2000,
                  "heartbeat.interval.ms": 500, "max.partition.fetch.bytes": 16 << 20,
                  "fetch.max.bytes": 64 << 20, "enable.partition.eof": False})
    try:
        c.subscribe([topic])
        got = 0
        while got == 0:                                      # the join and the first fetch
            got = len(c.consume(10000, timeout=0.1))
        t0 = time.perf_counter()                             # steady: from the first messages on
        first = got
        while got < n_messages:
            got += len(c.consume(10000, timeout=1.0))
            _seconds_left(t0, got, n_messages, "confluent-kafka")
        return _steady_seconds(t0, first, n_messages)
    finally:
        c.close()


def bare_poll(bootstrap: str, topic: str, n_messages: int, group: str, lean: bool) -> float:
    """Seconds for ``KafkaConsumer.poll`` to hand out ``n_messages`` (records dropped)."""
    from kafka import KafkaConsumer

    from streamsvi.io import _fastfetch

    c = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                      enable_auto_commit=False, auto_offset_reset="earliest",
                      session_timeout_ms=2000, heartbeat_interval_ms=500,
                      max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    if lean and not _fastfetch.install(c):
        raise RuntimeError("this kafka-python has no hook for the lean record reader")
    try:
        while not c.assignment():                            # join; give back what it read
            for tp, msgs in c.poll(timeout_ms=500, max_records=1).items():
                c.seek(tp, msgs[0].offset)
        got, t0, first = 0, None, 0
        while got < n_messages:
            for msgs in c.poll(timeout_ms=1000, max_records=100_000).values():
                got += sum(len(m.offsets) if type(m) is _fastfetch.LeanRun else 1 for m in msgs)
            if t0 is None:
                if got:                                  # steady: from the first messages on
                    t0, first = time.perf_counter(), got
                continue
            _seconds_left(t0, got, n_messages, "kafka-python")
        return _steady_seconds(t0, first, n_messages)
    finally:
        c.close(autocommit=False)


def source_only(cfg: dict, n_records: int) -> float:
    """Seconds for ``KafkaSource.poll_batch`` to read (decode, validate) every record."""
    from streamsvi.service.daemon import default_source
    from streamsvi.service.metrics import DaemonMetrics

    src = default_source(cfg, DaemonMetrics())
    try:
        src.wait_for_assignment(timeout_s=60.0)
        got = 0
        inf = cfg["inference"]
        t0 = time.perf_counter()
        while got < n_records:
            b = src.poll_batch(inf["batch_size"], inf["max_wait_seconds"])
            if b is not None:
                got += b.n_rows + len(b.dead)
            _seconds_left(t0, got, n_records, "the source")
        return time.perf_counter() - t0
    finally:
        src.close()


def daemon_run(cfg: dict, broker_pid: int, profile: bool) -> dict:
    """Run the daemon until drained: whole and steady seconds, counts, CPU."""
    from prometheus_client import CollectorRegistry

    from streamsvi.service.daemon import Daemon

    marks = {}

    class Timed(Daemon):
        def _poll(self, source, loop):
            b = super()._poll(source, loop)
            if b is not None and "first" not in marks:
                marks["first"] = time.perf_counter()
            return b

        def _update(self, x, loop):
            super()._update(x, loop)
            marks["last"] = time.perf_counter()

    d = Timed(cfg, registry=CollectorRegistry(), out=io.StringIO())
    prof = cProfile.Profile() if profile else None
    b0, c0 = proc_cpu_seconds(broker_pid), time.process_time()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    res = d.run(until_drained=True)
    if prof:
        prof.disable()
    out = {"wall": time.perf_counter() - t0, "res": res, "first": marks["first"] - t0,
           "steady": marks["last"] - marks["first"], "cpu": time.process_time() - c0,
           "broker_cpu": proc_cpu_seconds(broker_pid) - b0}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(25)
        out["profile"] = s.getvalue()
    return out


# -------------------------------------------------------------------- main
def main(argv=None) -> int:
    args = parse_args(argv)
    from streamsvi.io import LocalBroker

    info = machine_info()
    loads = {}
    for w in args.workloads:
        log(f"making the records of {w} ...")
        loads[w] = Workload(w, args)
    seconds: dict = {}          # (workload, compression, stage) -> [seconds per round]
    extra: dict = {}            # (workload, compression, stage) -> [dicts per round]
    engine: dict = {}           # workload -> [records/s per round]
    runs = 0

    def group(kind):
        nonlocal runs
        runs += 1
        return f"{kind}-{runs}"

    with LocalBroker() as broker, tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        bs = broker.bootstrap
        log(f"broker {bs} (tansu pid {broker.proc.pid})")
        topics = {}
        for w, load in loads.items():
            for comp in args.compressions:
                topic = f"e2e-{w}-{comp}"
                log(f"producing {load.n:,} {w} records to {topic!r} ({comp}) ...")
                t0 = time.perf_counter()
                n_msg = load.produce(bs, topic, comp)
                log(f"  {n_msg:,} messages in {time.perf_counter() - t0:.1f} s (not timed)")
                topics[(w, comp)] = (topic, n_msg)
        for r in range(args.repeats):
            log(f"---- round {r + 1} of {args.repeats}")
            for w, load in loads.items():
                cfg = load.config(bs, "unused", tmp, "unused")
                if load.model == "gmm":
                    engine.setdefault(w, []).append(engine_gmm(cfg, load.X, load.batch,
                                                               args.engine_seconds)[1])
                else:
                    engine.setdefault(w, []).append(load.n / engine_lda_whole(cfg, load.X))
                log(f"{w}: engine in memory {engine[w][-1]:,.0f} records/s")
                for comp in args.compressions:
                    topic, n_msg = topics[(w, comp)]
                    for stage in args.stages:
                        key = (w, comp, stage)
                        if stage == "confluent":
                            el = bare_confluent(bs, topic, n_msg, group("ck"))
                        elif stage in ("stock", "lean"):
                            el = bare_poll(bs, topic, n_msg, group(stage), lean=stage == "lean")
                        elif stage == "source":
                            el = source_only(load.config(bs, topic, tmp, group("source")), load.n)
                        else:
                            cfg = load.config(bs, topic, os.path.join(tmp, group("ck")),
                                              group("daemon"), prefetch=stage == "daemon-prefetch")
                            out = daemon_run(cfg, broker.proc.pid, args.profile)
                            res = out["res"]
                            if res.records + res.dead != load.n:
                                raise RuntimeError(f"{w} {comp}: the daemon learned {res.records} "
                                                   f"records and set aside {res.dead}, of {load.n}")
                            extra.setdefault(key, []).append(out)
                            el = out["wall"]
                            if args.profile:
                                print(f"---- cProfile, {w} {comp} {stage} (tottime) ----\n"
                                      f"{out['profile']}", file=sys.stderr)
                        seconds.setdefault(key, []).append(el)
                        log(f"{w} {comp:6s} {STAGE_NAMES[stage]:32s} {load.n / el:>12,.0f} records/s")
    report(args, info, loads, seconds, extra, engine)
    return 0


def report(args, info, loads, seconds, extra, engine) -> None:
    med = statistics.median
    print("=" * 100)
    print(f"end-to-end throughput through a local tansu broker, {PARTITIONS} partitions"
          f"{' (--quick)' if args.quick else ''}; median of {args.repeats} round(s), stages alternated")
    print("=" * 100)
    for ln in info:
        print(ln)
    print(f"daemon: max_wait_seconds={args.max_wait:g}, checkpoint every 2 s, metrics on, no held-out "
          f"reservoir; GMM |S|={args.batch_size}, binary messages of {args.message_rows} rows; "
          f"LDA K={LDA_K}, |S|={LDA_BATCH}, NYT x {args.lda_passes} pass(es)\n")
    rows, goals = [], []
    for w, load in loads.items():
        e = med(engine[w])
        rows.append([w, "-", "engine in memory" + (" (whole run)" if load.model == "lda" else ""),
                     f"{load.n:,}", f"{e:,.0f}", ""])
        plain_steady = None
        for comp in args.compressions:
            rate = {}
            for stage in args.stages:
                t = seconds.get((w, comp, stage))
                if not t:
                    continue
                rate[stage] = load.n / med(t)
                note = ""
                if stage in ("daemon", "daemon-prefetch"):
                    ex = extra[(w, comp, stage)]
                    steady = med([load.n / o["steady"] for o in ex])
                    rate[stage + "/steady"] = steady
                    cpu = med([o["cpu"] / load.n * 1e6 for o in ex])
                    bcpu = med([o["broker_cpu"] / load.n * 1e6 for o in ex])
                    first = med([o["first"] for o in ex])
                    rows.append([w, comp, STAGE_NAMES[stage] + ", whole run", f"{load.n:,}",
                                 f"{rate[stage]:,.0f}", f"first batch after {first:.2f} s"])
                    rows.append([w, comp, STAGE_NAMES[stage] + ", steady", f"{load.n:,}",
                                 f"{steady:,.0f}", f"CPU/record: daemon {cpu:.1f} us, broker {bcpu:.1f} us"])
                    continue
                if stage in ("stock", "lean") and "confluent" in rate:
                    note = f"{rate[stage] / rate['confluent']:.2f}x confluent"
                rows.append([w, comp, STAGE_NAMES[stage], f"{load.n:,}", f"{rate[stage]:,.0f}", note])
            if "daemon/steady" in rate:
                ceiling = min(rate.get("source", float("inf")), e)
                r = rate["daemon/steady"] / ceiling
                goals.append([w, comp, "daemon steady / min(source only, engine)", f"{r:.2f}",
                              ">= 0.8", "MET" if r >= 0.8 else "NOT MET"])
                if "daemon-prefetch/steady" in rate:
                    goals.append([w, comp, "  the same with source.prefetch = true",
                                  f"{rate['daemon-prefetch/steady'] / ceiling:.2f}", "", ""])
                if load.model == "lda":
                    r = rate["daemon"] / e
                    goals.append([w, comp, "daemon whole run / engine whole run", f"{r:.2f}", ">= 0.8",
                                  "MET" if r >= 0.8 else "NOT MET"])
                if comp == "none":
                    plain_steady = rate["daemon/steady"]
                elif plain_steady:
                    r = rate["daemon/steady"] / plain_steady
                    goals.append([w, comp, "daemon steady, compressed / plain", f"{r:.2f}", "~1", ""])
    print(fmt_table(["workload", "compression", "measurement", "records", "records/s", "note"],
                    rows, left=3))
    print()
    print(fmt_table(["workload", "compression", "ratio", "value", "goal", ""], goals, left=3))


if __name__ == "__main__":
    sys.exit(main())
