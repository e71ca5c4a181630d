"""End-to-end throughput (records/s) of the daemon through a Kafka broker.

Setting: Bayesian GMM with D = 8, K = 10, records drawn from a 10-component
Gaussian mixture in 8-D (fixed seed). A :class:`~streamsvi.io.LocalBroker`
(tansu, on 127.0.0.1, in-memory storage) is started and the records are
produced to a 3-partition topic *before* anything is timed:

* JSON codec: one record per message (``[x_1, ..., x_8]``), 500 000 records;
* binary batch codec: 1000 float64 rows per message, 5 000 000 records.

Then, per codec, in the same process (each with its own consumer group, so
each reads the whole topic):

``bare poll, kafka-python reader``
    ``KafkaConsumer.poll`` in a loop that does nothing with the records, with
    the consumer settings of ``KafkaSource``: the ceiling of the Kafka client
    as kafka-python ships it.
``bare poll, lean reader``
    the same with the lean record reader ``KafkaSource`` installs
    (:mod:`streamsvi.io._fastfetch`: offset and value only).
``source only``
    ``KafkaSource.poll_batch`` (decode + validate, no model) until every
    record is read, built by the daemon's own source factory from the config.
``daemon |S|=..., whole run``
    the real :class:`~streamsvi.service.daemon.Daemon` in-process, config
    through ``streamsvi.service.config.validate`` (metrics served on port 0,
    a checkpoint every 2 s into a temporary directory, a small held-out
    reservoir), timed from the call of ``run(until_drained=True)`` to its
    return: start-up (metrics server, group join), every batch, the
    checkpoints, the final checkpoint and the drained check.
``daemon |S|=..., steady``
    the same run from the first batch handed to the daemon to the last
    (start-up and the drained check left out).

The daemon runs with |S| = 1000 for JSON and with |S| = 1000 and 10 000 for
binary (``--binary-batch-sizes``): at |S| = 1000 the engine alone does about
1M records/s on this kind of machine, so the binary target needs bigger
minibatches.

and, once, ``engine in memory``: ``SVI.update`` on pre-made batches of the
daemon's batch size (no I/O), the same engine the daemon builds. Rates are
records that reached the model (or were read, for the source rows) divided by
wall time. The table ends with the targets: >= 100 000 records/s through the
broker with JSON and >= 1 000 000 records/s with binary batches.

Why ``OPENBLAS_NUM_THREADS=1`` (set below before numpy is imported): the
update's matrices are small ((|S| x 53) times (53 x K)); BLAS threads cost
more in start-up and synchronisation than they save, and this machine has two
cores, one of which the broker needs while the daemon consumes.

Run::

    python bench/e2e_throughput.py            # 500k JSON + 5M binary records, ~2 min
    python bench/e2e_throughput.py --repeats 2   # best and median of 2 runs per stage, ~2.5 min
    python bench/e2e_throughput.py --quick    # 100k JSON + 1M binary records, < 1 min
    python bench/e2e_throughput.py --codec json --profile   # + cProfile of the daemon run

The table goes to stdout, progress to stderr.
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

D, K = 8, 10
PARTITIONS = 3
TARGETS = {"json": 100_000, "binary": 1_000_000}
T0 = time.monotonic()


def log(msg):
    print(f"[e2e {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records (100k JSON, 1M binary)")
    ap.add_argument("--codec", choices=("json", "binary", "both"), default="both")
    ap.add_argument("--json-records", type=int, default=None, help="default 500 000 (100 000 quick)")
    ap.add_argument("--binary-records", type=int, default=None,
                    help="default 5 000 000 (1 000 000 quick)")
    ap.add_argument("--message-rows", type=int, default=1000, help="rows per binary message")
    ap.add_argument("--batch-size", type=int, default=1000, help="daemon |S| for JSON")
    ap.add_argument("--binary-batch-sizes", default="1000,10000",
                    help="daemon |S| for binary, comma-separated: one daemon run each")
    ap.add_argument("--repeats", type=int, default=1,
                    help="runs of each timed stage (best and median reported)")
    ap.add_argument("--M", type=float, default=None,
                    help="SVI+ effective batch size (default: plain SVI)")
    ap.add_argument("--max-wait", type=float, default=0.5, help="inference.max_wait_seconds")
    ap.add_argument("--engine-seconds", type=float, default=None,
                    help="length of one timed engine window (default 1, quick 0.5); best of 3")
    ap.add_argument("--skip", default="", help="comma list of stages to skip: bare,source,daemon")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile the daemon runs; top functions to stderr")
    args = ap.parse_args(argv)
    if args.json_records is None:
        args.json_records = 100_000 if args.quick else 500_000
    if args.binary_records is None:
        args.binary_records = 1_000_000 if args.quick else 5_000_000
    args.binary_batch_sizes = [int(v) for v in str(args.binary_batch_sizes).split(",") if v.strip()]
    if not args.binary_batch_sizes or min(args.binary_batch_sizes) < 1 or args.repeats < 1:
        ap.error("--binary-batch-sizes must be integers >= 1 and --repeats >= 1")
    if args.engine_seconds is None:
        args.engine_seconds = 0.5 if args.quick else 1.0
    args.codecs = ["json", "binary"] if args.codec == "both" else [args.codec]
    args.skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    return args


# ----------------------------------------------------------------- machine
def machine_info() -> list[str]:
    import kafka

    cpu, blas_s = cpu_model(), blas_build()
    aff = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        import orjson  # noqa: F401
        fast_json = "orjson " + orjson.__version__
    except ImportError:
        fast_json = "not installed (stdlib json)"
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) / 2 ** 20
    except (OSError, ValueError, IndexError):
        mem = float("nan")
    return [f"CPU: {cpu}; logical CPUs {os.cpu_count()} (usable {aff}); memory {mem:.0f} GiB; "
            f"load average {os.getloadavg()[0]:.2f}",
            f"Python {platform.python_version()} ({platform.python_implementation()}), numpy "
            f"{np.__version__} (BLAS {blas_s}), kafka-python {kafka.__version__}, orjson: {fast_json}",
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
def make_data(n: int, seed: int = 0) -> np.ndarray:
    """``n`` records of a K = 10 Gaussian mixture in D = 8 (identity covariances)."""
    from streamsvi.datasets import make_blobs

    centers = np.random.default_rng(seed).normal(0.0, 4.0, (K, D))
    X, _ = make_blobs(n, centers=centers, seed=seed + 1)
    return X


def produce(bootstrap: str, topic: str, X: np.ndarray, codec, message_rows: int) -> int:
    from streamsvi.io import create_topic, produce_rows

    create_topic(bootstrap, topic, partitions=PARTITIONS)
    multi = codec.rows_per_message != 1
    return produce_rows(bootstrap, topic, X, codec, batch_rows=message_rows if multi else None,
                        partitions=PARTITIONS, timeout_s=600.0,
                        producer_config={"linger_ms": 20, "batch_size": 1 << 20})


# ------------------------------------------------------------------ config
def make_config(args, bootstrap: str, topic: str, codec: str, n_total: int, ckdir: str,
                group: str, batch: int) -> dict:
    from streamsvi.service.config import validate

    inference = {"n_total": n_total, "batch_size": batch, "max_wait_seconds": args.max_wait,
                 "seed": 0}
    if args.M is not None:
        inference["effective_batch_size"] = min(args.M, batch)
    return validate({
        "model": {"kind": "gmm", "n_components": K, "n_features": D,
                  "weight_concentration": 0.5, "mean_precision": 0.1, "scale": 1.0},
        "inference": inference,
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic],
                   "group_id": group, "codec": codec, "connect_attempts": 3},
        "validation": {"max_message_bytes": 16 << 20},
        "checkpoint": {"directory": ckdir, "every_seconds": 2.0, "every_batches": 1_000_000,
                       "keep": 2},
        "metrics": {"enabled": True, "port": 0, "heldout_size": 200, "heldout_every": 10,
                    "progress_seconds": 2.0},
    })


# ------------------------------------------------------------------ stages
def engine_rate(cfg: dict, X: np.ndarray, batch: int, window_s: float) -> tuple[float, float]:
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


def bare_poll(bootstrap: str, topic: str, n_messages: int, group: str,
              lean: bool) -> tuple[float, int]:
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
        got, polls = 0, 0
        t0 = time.perf_counter()
        while got < n_messages:
            polls += 1
            for msgs in c.poll(timeout_ms=1000, max_records=100_000).values():
                # the lean reader hands out one run per record batch
                got += sum(len(m.offsets) if type(m) is _fastfetch.LeanRun else 1 for m in msgs)
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"bare poll read only {got} of {n_messages} messages in 600 s")
        return time.perf_counter() - t0, polls
    finally:
        c.close(autocommit=False)


def source_only(cfg: dict, n_records: int) -> tuple[float, int, int]:
    """(seconds, rows, dead) for ``KafkaSource.poll_batch`` to read every record."""
    from streamsvi.service.daemon import default_source
    from streamsvi.service.metrics import DaemonMetrics

    src = default_source(cfg, DaemonMetrics())
    try:
        src.wait_for_assignment(timeout_s=60.0)
        rows = dead = 0
        inf = cfg["inference"]
        t0 = time.perf_counter()
        while rows + dead < n_records:
            b = src.poll_batch(inf["batch_size"], inf["max_wait_seconds"])
            if b is not None:
                rows += b.n_rows
                dead += len(b.dead)
            elif time.perf_counter() - t0 > 600:
                raise RuntimeError(f"source read only {rows + dead} of {n_records} records in 600 s")
        return time.perf_counter() - t0, rows, dead
    finally:
        src.close()


class _TimedSource:
    """Wraps the daemon's source to note when the first and last batches came out."""

    def __init__(self, src):
        self._src = src
        self.first = self.last = None
        self.first_rows = 0

    def poll_batch(self, *a, **kw):
        b = self._src.poll_batch(*a, **kw)
        if b is not None:
            now = time.perf_counter()
            if self.first is None:
                self.first, self.first_rows = now, b.n_rows + len(b.dead)
            self.last = now
        return b

    def __getattr__(self, name):
        return getattr(self._src, name)


def daemon_run(cfg: dict, broker_pid: int, profile: bool) -> dict:
    """Run the daemon until drained; timings and counts."""
    from prometheus_client import CollectorRegistry

    from streamsvi.service.daemon import Daemon, default_source

    timed = {}

    def factory(c, metrics):
        timed["src"] = _TimedSource(default_source(c, metrics))
        return timed["src"]

    d = Daemon(cfg, registry=CollectorRegistry(), source_factory=factory, out=sys.stderr)
    prof = cProfile.Profile() if profile else None
    b0, c0 = proc_cpu_seconds(broker_pid), time.process_time()
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    res = d.run(until_drained=True)
    if prof:
        prof.disable()
    wall = time.perf_counter() - t0
    out = {"wall": wall, "res": res, "first": timed["src"].first - t0,
           "steady": timed["src"].last - timed["src"].first,
           "first_rows": timed["src"].first_rows,
           "cpu": time.process_time() - c0, "broker_cpu": proc_cpu_seconds(broker_pid) - b0}
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
        out["profile"] = s.getvalue()
    return out


# ------------------------------------------------------------------- table
def row(codec, what, n, times, note):
    """A table row from the seconds of each run (best and median rate of ``n`` records)."""
    return [codec, what, f"{n:,}", f"{min(times):.2f}", f"{n / min(times):,.0f}",
            f"{n / statistics.median(times):,.0f}", note]


def main(argv=None) -> int:
    args = parse_args(argv)
    from streamsvi.io import BinaryBatchCodec, JsonCodec, LocalBroker

    info = machine_info()
    n_max = max(args.json_records if "json" in args.codecs else 0,
                args.binary_records if "binary" in args.codecs else 0)
    log(f"making {n_max:,} records (D={D}, K={K} mixture)")
    X = make_data(n_max)
    rows, notes = [], []
    with LocalBroker() as broker, tempfile.TemporaryDirectory(prefix="e2e-") as tmp:
        log(f"broker {broker.bootstrap} (tansu pid {broker.proc.pid})")
        # ---- load every topic before anything is timed
        plan = {}
        for codec in args.codecs:
            n = args.json_records if codec == "json" else args.binary_records
            topic = f"e2e-{codec}"
            c = JsonCodec(D) if codec == "json" else BinaryBatchCodec(D)
            log(f"producing {n:,} {codec} records to {topic!r} ({PARTITIONS} partitions) ...")
            t0 = time.perf_counter()
            n_msg = produce(broker.bootstrap, topic, X[:n], c, args.message_rows)
            el = time.perf_counter() - t0
            log(f"  {n_msg:,} messages in {el:.1f} s ({n / el:,.0f} records/s, not timed)")
            plan[codec] = (topic, n, n_msg)
        # ---- engine in memory
        sizes = {c: [args.batch_size] if c == "json" else args.binary_batch_sizes
                 for c in args.codecs}
        engine_rates = {}
        for codec in args.codecs:
            topic, n, _ = plan[codec]
            for S in sizes[codec]:
                if S not in engine_rates:
                    log(f"engine in memory, |S| = {S} ...")
                    cfg = make_config(args, broker.bootstrap, topic, codec, n, tmp, "unused", S)
                    engine_rates[S] = engine_rate(cfg, X, S, args.engine_seconds)
        for S, (best, med) in engine_rates.items():
            rows.append(["-", f"engine in memory (SVI.update, |S|={S}), 3 x {args.engine_seconds:g} s",
                         "", "", f"{best:,.0f}", f"{med:,.0f}", ""])
        # ---- per codec: bare poll, source only, daemon
        runs = 0

        def group(kind):
            nonlocal runs
            runs += 1
            return f"{kind}-{runs}"

        for codec in args.codecs:
            topic, n, n_msg = plan[codec]
            target = TARGETS[codec]
            if "bare" not in args.skip:
                for lean in (False, True):
                    what = "lean reader" if lean else "kafka-python reader"
                    log(f"{codec}: bare poll of {n_msg:,} messages, {what} ...")
                    times = [bare_poll(broker.bootstrap, topic, n_msg, group("bare"), lean)[0]
                             for _ in range(args.repeats)]
                    rows.append(row(codec, f"bare poll, {what}", n, times,
                                    f"{n_msg / min(times):,.0f} msg/s"))
            if "source" not in args.skip:
                S = sizes[codec][0]
                log(f"{codec}: source only (KafkaSource.poll_batch, |S| = {S}) ...")
                times = []
                for _ in range(args.repeats):
                    cfg = make_config(args, broker.bootstrap, topic, codec, n, tmp, group("source"), S)
                    el, got, dead = source_only(cfg, n)
                    times.append(el)
                rows.append(row(codec, f"source only (poll_batch |S|={S}: decode + validate)",
                                got, times, f"{dead} dead"))
            if "daemon" in args.skip:
                continue
            for S in sizes[codec]:
                wall, steady, last, n_steady = [], [], None, 0
                for _ in range(args.repeats):
                    log(f"{codec}: daemon run(until_drained=True), |S| = {S} ...")
                    ckdir = os.path.join(tmp, group("ck"))
                    cfg = make_config(args, broker.bootstrap, topic, codec, n, ckdir,
                                      group("daemon"), S)
                    r = last = daemon_run(cfg, broker.proc.pid, args.profile)
                    res = r["res"]
                    seen = res.records + res.heldout
                    wall.append(r["wall"])
                    steady.append(r["steady"])
                    n_steady = seen - r["first_rows"]
                    notes.append(f"{codec} daemon |S|={S}: {res.batches} batches, {res.heldout} held "
                                 f"out, {res.dead} dead, {res.checkpoints} checkpoints, stopped by "
                                 f"{res.stopped_by!r}; first batch after {r['first']:.2f} s, last "
                                 f"batch {r['wall'] - r['first'] - r['steady']:.2f} s before the "
                                 f"end; CPU: daemon process {r['cpu']:.1f} s, broker "
                                 f"{r['broker_cpu']:.1f} s (wall {r['wall']:.1f} s)")
                    if seen + res.dead != n:
                        notes.append(f"!! {codec} daemon saw {seen + res.dead:,} records, "
                                     f"expected {n:,}")
                    if args.profile:
                        print(f"---- cProfile of the {codec} daemon run, |S|={S} (tottime) ----\n"
                              f"{r['profile']}", file=sys.stderr)
                def met(k, t):
                    return f">= {target:,}: {'MET' if k / min(t) >= target else 'NOT MET'}"
                n_model = last["res"].records
                rows.append(row(codec, f"daemon |S|={S}, whole run(until_drained)", n_model, wall,
                                met(n_model, wall)))
                rows.append(row(codec, f"daemon |S|={S}, steady (1st -> last batch)", n_steady,
                                steady, met(n_steady, steady)))
    print("=" * 100)
    print(f"end-to-end throughput: GMM D={D}, K={K}, {PARTITIONS} partitions, local tansu broker"
          f"{' (--quick)' if args.quick else ''}")
    print("=" * 100)
    for ln in info:
        print(ln)
    print(f"engine: {'plain SVI' if args.M is None else f'SVI+ M={args.M:g}'}; daemon "
          f"max_wait_seconds={args.max_wait:g}, checkpoint every 2 s, metrics on, held-out 200; "
          f"binary messages of {args.message_rows} rows (float64); best of {args.repeats} "
          f"run(s) per stage, records/s = records / seconds\n")
    print(fmt_table(["codec", "measurement", "records", "seconds", "records/s",
                     "median rec/s", "note"], rows, left=2))
    print()
    for ln in notes:
        print(ln)
    return 0


if __name__ == "__main__":
    sys.exit(main())
