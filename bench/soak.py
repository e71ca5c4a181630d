"""Soak: every model kind's daemon at a steady rate for a long time; pass or fail on growth.

What it runs (all real, all at once):

* one local broker (:class:`streamsvi.io.LocalBroker`, tansu on 127.0.0.1);
* per model kind (every ``model.kind`` of ``streamsvi.models.CONFIG_KINDS``; the
  single-process daemon, not the scale-out roles): a one-partition topic, a
  small model of that kind (:data:`SPECS`; a kind without an entry gets its
  class's check-suite case, :func:`spec_from_check_case`), and its daemon as a subprocess,
  ``streamsvi run --config <workdir>/<kind>/config.toml``, with metrics served
  on a free port of 127.0.0.1 (port 0; the URL is read from its stderr), a
  checkpoint every ``--checkpoint-seconds`` (``keep = 3``) and a small held-out
  reservoir;
* per kind, one producer thread writing valid JSON records (one per message,
  checked with the daemon's own codec and validator before the run) at a steady
  ``--rate`` records/s for ``--minutes`` minutes.

Every ``--sample-seconds`` it samples, per daemon: RSS (``VmRSS`` of
``/proc/<pid>/status``), open file descriptors (``/proc/<pid>/fd``), snapshots on
disk (``snap-*`` in the checkpoint directory) and checkpoints written
(``streamsvi_checkpoints_total``), the daemon's consumer lag
(``streamsvi_consumer_lag_records``), records produced (acknowledged by the
broker) and accounted for (``streamsvi_records_consumed_total`` +
``streamsvi_heldout_records`` + ``streamsvi_records_dead_lettered_total``, scraped
from the real metrics endpoint), and the backlog = produced - accounted. One
progress line per sample goes to stdout.

After the steady phase the producers stop; the soak waits (``--drain-seconds``
at most) until every daemon has accounted for every record, stops each daemon
by its pid with SIGTERM, and reads each one's last snapshot.

The verdict (:func:`growth_verdict` on the samples of the steady phase, then the
end checks), per kind; the soak fails if any kind fails:

* warm-up: the first ``--warmup`` fraction (default 20 %) of the steady phase is
  left out; the rest is cut into a first and a second half, and the medians of
  the two halves are compared (medians: one sample taken mid-checkpoint or
  mid-batch does not decide);
* RSS: fails if median(2nd half) - median(1st half) > max(``--rss-mb`` MB,
  ``--rss-frac`` x median(1st half)); defaults 16 MB and 5 %;
* file descriptors: fails if median(2nd) - median(1st) > ``--fd-slack`` (3), or
  if any post-warm-up sample is more than ``2 x fd-slack`` above the 1st
  half's median;
* lag: fails if the backlog (produced - accounted) or the daemon's lag metric
  grows by more than ``--lag-seconds`` (10) seconds of production
  (median(2nd) - median(1st) > max(50, 10 x rate) records): consumption does
  not keep up with the steady rate;
* checkpoints: fails if a sample finds more than ``keep + 1`` snapshots on disk
  (retention not working), or if no checkpoint was written in the second half;
* the daemon exits (at any sample), a scrape fails twice running in the second
  half, or either half has fewer than two samples (run longer);
* end: a record the broker did not acknowledge, a kind that has not accounted
  for every record produced after the drain, any record dead-lettered (every
  record sent is valid), a daemon that does not exit 0 within 60 s of SIGTERM,
  or a last snapshot whose offsets are not the topic's end or whose
  ``records_seen`` + held-out records are not the records produced.

The final table (per kind: RSS first / median of each half / last / max, fds
first / last, checkpoints written and most snapshots on disk, records produced
and accounted for, largest lag and backlog, verdict) goes to stdout; ``--out
PATH`` writes the summary, every sample included, as JSON to ``PATH`` and the
table as markdown next to it (``PATH`` with suffix ``.md``). The exit status is
0 when every kind passes, 1 otherwise (2: bad arguments).

Daemons and producer threads share the machine: ``OPENBLAS_NUM_THREADS``,
``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are 1 in the daemons' environment
(ten daemons on two cores: BLAS threads only contend), models are small, and
the rate is per kind.

Run::

    python bench/soak.py --minutes 60 --out bench/results/soak_60min.json   # the hour-long soak
    python bench/soak.py --minutes 5 --rate 10                               # what tests/test_soak.py runs
    python bench/soak.py --minutes 2 --kinds gmm,lda --rate 50                # a few kinds, faster
    python bench/soak.py --list-kinds

The hour-long run at the default rate (20 records/s per kind, every kind)
needs about 1 GB of memory for the daemons and leaves most of two cores idle.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fmt_table  # noqa: E402

STREAMSVI = str(Path(sys.executable).with_name("streamsvi"))
METRICS_URL_RE = re.compile(r"metrics: (http://\S+/metrics)")
SNAP_RE = re.compile(r"^snap-\d+$")
KEEP = 3


# ================================================================ per-kind models and records
@dataclass(frozen=True)
class KindSpec:
    """One model kind in the soak: its ``[model]`` table, extra sections, and a record maker.

    ``records(rng, n)`` returns ``n`` JSON values, one record each, in the kind's JSON
    codec's layout (the README and ``streamsvi/io/<record kind>.py``).
    """

    model: dict
    records: object
    validation: dict = field(default_factory=dict)


_CENTRES_2D = np.array([[-4.0, 0.0], [0.0, 4.0], [4.0, -1.0]])


def _blobs_2d(rng, n):
    x = _CENTRES_2D[rng.integers(0, 3, n)] + rng.normal(scale=0.7, size=(n, 2))
    return [[round(float(a), 6), round(float(b), 6)] for a, b in x]


def _gauss1d(rng, n):
    x = np.array([-3.0, 0.5, 4.0])[rng.integers(0, 3, n)] + rng.normal(size=n)
    return [[round(float(v), 6)] for v in x]


_HMM_A = np.array([[0.8, 0.15, 0.05], [0.1, 0.8, 0.1], [0.2, 0.1, 0.7]])
_HMM_B = np.array([[0.7, 0.2, 0.05, 0.05], [0.05, 0.7, 0.2, 0.05], [0.05, 0.05, 0.3, 0.6]])


def _hmm(rng, n):
    out = []
    for length in rng.integers(5, 21, n):
        z = rng.choice(3, p=[0.5, 0.3, 0.2])
        seq = []
        for _ in range(length):
            seq.append(int(rng.choice(4, p=_HMM_B[z])))
            z = rng.choice(3, p=_HMM_A[z])
        out.append(seq)
    return out


_LDA_V, _LDA_K = 30, 3


def _lda(rng, n):
    topics = np.full((_LDA_K, _LDA_V), 0.001)
    for k in range(_LDA_K):
        topics[k, 10 * k:10 * k + 10] = 0.1
    topics /= topics.sum(axis=1, keepdims=True)
    out = []
    for theta in rng.dirichlet(np.full(_LDA_K, 0.3), n):
        counts = rng.multinomial(40, theta @ topics)
        ids = np.flatnonzero(counts)
        out.append({"ids": ids.tolist(), "counts": counts[ids].tolist()})
    return out


#: a fixed population of users and items: the row blocks of PMF and HPF stop growing
#: once each has been seen (well inside the warm-up at any rate the soak runs)
_USERS, _ITEMS = 60, 40


def _ratings(rng, n):
    u, i = rng.integers(0, _USERS, n), rng.integers(0, _ITEMS, n)
    r = np.clip(np.rint(3.0 + 0.8 * np.sin(u) + 0.8 * np.cos(i) + rng.normal(scale=0.5, size=n)), 1, 5)
    return [{"user": f"u{a}", "item": f"i{b}", "rating": float(c)} for a, b, c in zip(u, i, r)]


def _counts(rng, n):
    u, i = rng.integers(0, _USERS, n), rng.integers(0, _ITEMS, n)
    c = rng.poisson(1.0 + ((u % 3) == (i % 3)) * 3.0)
    return [{"user": int(a), "item": int(b), "rating": int(k)} for a, b, k in zip(u, i, c)]


_W = np.array([1.5, -2.0, 0.5])


def _labelled(rng, n):
    x = rng.normal(size=(n, 3))
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ _W)))).astype(int)
    return [{"x": [round(float(v), 6) for v in row], "y": int(c)} for row, c in zip(x, y)]


_W3 = np.array([[1.5, -2.0, 0.5], [-1.0, 1.0, 1.0], [0.0, 0.5, -1.5]])


def _labelled3(rng, n):
    x = rng.normal(size=(n, 3))
    logits = x @ _W3.T
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = (p.cumsum(axis=1) > rng.random(n)[:, None]).argmax(axis=1)
    return [{"x": [round(float(v), 6) for v in row], "y": int(c)} for row, c in zip(x, y)]


#: model.kind -> what the soak runs, hand-made; a kind of streamsvi.models.CONFIG_KINDS without an
#: entry is soaked from its check-suite case (:func:`spec`; :func:`missing_kinds` says which
#: kinds have neither, and the test checks there are none)
SPECS: dict[str, KindSpec] = {
    "gmm": KindSpec({"kind": "gmm", "n_components": 3, "n_features": 2}, _blobs_2d),
    "gmm_dp": KindSpec({"kind": "gmm_dp", "n_components": 10, "n_features": 2}, _blobs_2d),
    "gauss1d": KindSpec({"kind": "gauss1d", "n_components": 3, "sigma2": 1.0, "prior_var": 25.0},
                        _gauss1d),
    "hmm": KindSpec({"kind": "hmm", "n_components": 3, "n_symbols": 4, "predictive_draws": 20}, _hmm),
    "lda": KindSpec({"kind": "lda", "n_components": _LDA_K, "n_features": _LDA_V,
                     "max_doc_update_iter": 50}, _lda),
    "pmf": KindSpec({"kind": "pmf", "n_factors": 2, "offset": 3.0, "remember_rated": False}, _ratings,
                    validation={"min_rating": 1.0, "max_rating": 5.0}),
    "hpf": KindSpec({"kind": "hpf", "n_factors": 2, "remember_rated": False}, _counts),
    "logistic": KindSpec({"kind": "logistic", "n_features": 3}, _labelled),
    "softmax": KindSpec({"kind": "softmax", "n_features": 3, "n_classes": 3}, _labelled3),
}


def spec_from_check_case(kind: str) -> KindSpec | None:
    """A soak spec for ``kind`` from its class's check-suite case (``check_cases``; the case named
    after the kind, else the first): the
    case's model settings and its records, drawn with replacement; None if the class has no case
    or the case's settings are not a config's. A kind without an entry in :data:`SPECS` is soaked
    this way, so a new model family needs nothing here."""
    from streamsvi.io.records import record_kind
    from streamsvi.models import CONFIG_KINDS

    cls = CONFIG_KINDS[kind]
    cases = cls.check_cases()
    if not cases:
        return None
    model, records = (cases.get(kind) or next(iter(cases.values())))()   # the kind's own case first
    settings = {}
    for k, v in model.get_params().items():
        s = cls.settings.get(k)
        if s is not None and s.config and v is not None:
            settings[s.config_name or k] = v
    values = record_kind(model).to_json(records)
    if not values:
        return None

    def draw(rng, n):
        return [values[i] for i in rng.integers(0, len(values), n)]

    return KindSpec({"kind": kind, **settings}, draw)


def spec(kind: str) -> KindSpec:
    """The soak's spec of ``kind``: its entry in :data:`SPECS`, else :func:`spec_from_check_case`."""
    if kind in SPECS:
        return SPECS[kind]
    made = spec_from_check_case(kind)
    if made is None:
        raise KeyError(kind)
    SPECS[kind] = made
    return made


def missing_kinds() -> list[str]:
    """Kinds the daemon runs (``CONFIG_KINDS``) that the soak cannot run: no entry in
    :data:`SPECS` and no check-suite case to build one from."""
    from streamsvi.models import CONFIG_KINDS

    out = []
    for kind in CONFIG_KINDS:
        try:
            spec(kind)
        except KeyError:
            out.append(kind)
    return sorted(out)


def all_kinds() -> list[str]:
    """Every kind the daemon runs, in registry order (what the soak runs by default)."""
    from streamsvi.models import CONFIG_KINDS

    missing = set(missing_kinds())
    return [k for k in CONFIG_KINDS if k not in missing]


def kind_config(kind: str, *, bootstrap: str, topic: str, group: str, directory: Path,
                checkpoint_seconds: float = 10.0, batch_size: int = 50) -> dict:
    """The daemon config (sections of scalars) of ``kind`` in the soak."""
    sp = spec(kind)
    return {
        "model": dict(sp.model),
        "inference": {"n_total": 100_000, "batch_size": batch_size, "max_wait_seconds": 1.0, "seed": 1},
        "source": {"kind": "kafka", "bootstrap_servers": bootstrap, "topics": [topic], "group_id": group,
                   "codec": "json", "session_timeout_ms": 6000, "heartbeat_interval_ms": 1000},
        "validation": dict(sp.validation),
        "checkpoint": {"directory": str(directory), "keep": KEEP, "every_seconds": float(checkpoint_seconds),
                       "every_batches": 1_000_000},
        "metrics": {"enabled": True, "host": "127.0.0.1", "port": 0, "heldout_size": 20,
                    "heldout_every": 20, "progress_seconds": 0.0},
    }


def encode(values) -> list[bytes]:
    return [json.dumps(v, separators=(",", ":")).encode() for v in values]


def check_records(cfg: dict, payloads: list[bytes]) -> None:
    """Decode and validate ``payloads`` as the daemon of ``cfg`` will; ``ValueError`` on any
    record it would dead-letter (a soak of records the daemon refuses measures nothing)."""
    from streamsvi.io.records import record_kind
    from streamsvi.service.config import build_model, validate

    vcfg = validate(cfg)
    model = build_model(vcfg["model"])
    kind = record_kind(model)
    codec = kind.make_codec(vcfg["source"]["codec"], model, {**vcfg["source"], **(vcfg.get("records") or {})})
    validator = kind.make_validator(model, vcfg["validation"])
    parts = [codec.decode_rows(p) for p in payloads]
    good, bad = validator.validate(kind.concat(parts))
    if bad:
        row, reason, message = bad[0]
        raise ValueError(f"{cfg['model']['kind']}: record {row} would be dead-lettered ({reason}: {message}): "
                         f"{payloads[row][:200]!r}")
    model.check_batch(good)


# ================================================================ the growth verdict
@dataclass(frozen=True)
class Rule:
    """The growth rule (module docstring). Bounds are on median(2nd half) - median(1st half)."""

    warmup: float = 0.2          # fraction of the steady phase left out at its start
    rss_mb: float = 16.0         # RSS growth allowed, MB ...
    rss_frac: float = 0.05       # ... or this fraction of the 1st half's median, whichever is larger
    fd_slack: int = 3            # open fds growth allowed
    lag_seconds: float = 10.0    # backlog / lag growth allowed, in seconds of production
    lag_floor: int = 50          # ... and at least this many records
    keep: int = KEEP             # snapshots the daemon keeps (more than keep + 1 on disk fails)


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _halves(samples, rule: Rule):
    """The post-warm-up samples as (1st half, 2nd half), by time."""
    if not samples:
        return [], []
    t0, t1 = samples[0]["t"], samples[-1]["t"]
    cut = t0 + rule.warmup * (t1 - t0)
    rest = [s for s in samples if s["t"] >= cut]
    mid = len(rest) // 2
    return rest[:mid], rest[mid:]


def growth_verdict(samples: list[dict], rate: float, rule: Rule = Rule()) -> tuple[list[str], dict]:
    """Reasons to fail (``[]`` = pass) and the numbers compared, for one kind's steady phase.

    ``samples``: dicts with ``t`` (s), ``alive`` (bool), ``rss`` (bytes), ``fds``, ``snapshots``
    (on disk), ``checkpoints`` (written, cumulative), ``lag`` and ``backlog`` (records); a value
    is None when that sample could not read it (a failed scrape). ``rate``: records/s produced.
    """
    reasons, numbers = [], {}
    dead = [s for s in samples if not s.get("alive", True)]
    if dead:
        reasons.append(f"daemon exited (rc {dead[0].get('rc')}) at t = {dead[0]['t']:.0f} s")
    first, second = _halves(samples, rule)
    if len(first) < 2 or len(second) < 2:
        reasons.append(f"too few samples after the warm-up ({len(first)} + {len(second)}); run longer or "
                       f"sample more often")
        return reasons, numbers
    if any(s.get(k) is None for s in second for k in ("rss", "fds", "backlog", "checkpoints")):
        reasons.append("a sample of the 2nd half could not be read (daemon gone or metrics endpoint not "
                       "answering)")

    rss1, rss2 = _median(s["rss"] for s in first), _median(s["rss"] for s in second)
    if rss1 is not None and rss2 is not None:
        bound = max(rule.rss_mb * 2 ** 20, rule.rss_frac * rss1)
        numbers["rss_growth_mb"] = (rss2 - rss1) / 2 ** 20
        numbers["rss_bound_mb"] = bound / 2 ** 20
        if rss2 - rss1 > bound:
            reasons.append(f"RSS grew {numbers['rss_growth_mb']:.1f} MB (median {rss1 / 2 ** 20:.1f} -> "
                           f"{rss2 / 2 ** 20:.1f} MB) > {bound / 2 ** 20:.1f} MB")

    fd1, fd2 = _median(s["fds"] for s in first), _median(s["fds"] for s in second)
    if fd1 is not None and fd2 is not None:
        numbers["fd_growth"] = fd2 - fd1
        if fd2 - fd1 > rule.fd_slack:
            reasons.append(f"open fds grew {fd2 - fd1:g} (median {fd1:g} -> {fd2:g}) > {rule.fd_slack}")
        peak = max((s["fds"] for s in first + second if s["fds"] is not None), default=fd1)
        if peak - fd1 > 2 * rule.fd_slack:
            reasons.append(f"open fds reached {peak} (1st half median {fd1:g}, allowed +{2 * rule.fd_slack})")

    slack = max(rule.lag_floor, rule.lag_seconds * rate)
    numbers["lag_slack"] = slack
    for key, what in (("backlog", "backlog (produced - accounted)"), ("lag", "consumer lag metric")):
        a, b = _median(s.get(key) for s in first), _median(s.get(key) for s in second)
        if a is None or b is None:
            continue
        numbers[f"{key}_growth"] = b - a
        if b - a > slack:
            reasons.append(f"{what} grew {b - a:g} records (median {a:g} -> {b:g}) > {slack:g} "
                           f"({rule.lag_seconds:g} s at {rate:g}/s): consumption does not keep up")

    most = max((s["snapshots"] for s in samples if s.get("snapshots") is not None), default=0)
    numbers["max_snapshots"] = most
    if most > rule.keep + 1:
        reasons.append(f"{most} snapshots on disk (keep = {rule.keep}): retention is not deleting")
    ck = [s["checkpoints"] for s in second if s.get("checkpoints") is not None]
    if len(ck) >= 2 and ck[-1] <= ck[0]:
        reasons.append(f"no checkpoint written in the 2nd half (checkpoints_total stayed at {ck[0]:g})")
    return reasons, numbers


# ================================================================ processes, metrics, /proc
def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{metric name: sum of its samples over labels}``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, rest = line.rpartition(" ")
        if not name_labels:
            continue
        name = name_labels.split("{", 1)[0]
        try:
            v = float(rest)
        except ValueError:
            continue
        if math.isfinite(v):
            out[name] = out.get(name, 0.0) + v
    return out


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds ``pid`` has used (``/proc/<pid>/stat``); None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_rss_fds(pid: int) -> tuple[int | None, int | None]:
    """(VmRSS in bytes, open fds) of ``pid`` from /proc; (None, None) once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            rss = next((int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmRSS:")), None)
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None, None
    return rss, fds


def count_snapshots(directory: Path) -> int:
    try:
        return sum(1 for n in os.listdir(directory) if SNAP_RE.match(n))
    except FileNotFoundError:
        return 0


def _term_with_parent() -> None:
    """In the child before exec: SIGTERM it when the soak dies, even by SIGKILL (Linux prctl)."""
    import ctypes

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)     # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


class DaemonProc:
    """``streamsvi run --config FILE`` as a subprocess, output in files next to the config."""

    def __init__(self, kind: str, config: Path, ck_dir: Path):
        self.kind, self.config, self.ck_dir = kind, config, ck_dir
        self.stdout_path, self.stderr_path = config.with_suffix(".out"), config.with_suffix(".err")
        env = dict(os.environ, PYTHONUNBUFFERED="1", OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1",
                   MKL_NUM_THREADS="1")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen([STREAMSVI, "run", "--config", str(config)], stdout=out,
                                         stderr=err, stdin=subprocess.DEVNULL, env=env,
                                         preexec_fn=_term_with_parent)
        self.url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except FileNotFoundError:
            return ""

    def find_url(self) -> str | None:
        if self.url is None:
            m = METRICS_URL_RE.search(self.stderr_tail(1 << 20))
            self.url = m.group(1) if m else None
        return self.url

    def scrape(self, timeout_s: float = 5.0) -> dict[str, float] | None:
        url = self.find_url()
        if url is None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:
                return parse_metrics(r.read().decode())
        except OSError:
            return None


def accounted(m: dict | None) -> int | None:
    """Records a daemon has taken off its topic: applied, held out, or dead-lettered."""
    if m is None:
        return None
    return int(m.get("streamsvi_records_consumed_total", 0) + m.get("streamsvi_heldout_records", 0)
               + m.get("streamsvi_records_dead_lettered_total", 0))


class SteadyProducer(threading.Thread):
    """Writes ``kind``'s records to ``topic`` at ``rate`` records/s (one per message) until stopped;
    ``acked`` counts the messages the broker acknowledged, ``failed`` the ones it did not."""

    def __init__(self, producer, kind: str, topic: str, rate: float, seed: int, send_every: float = 0.5):
        super().__init__(name=f"soak-producer-{kind}", daemon=True)
        self.producer, self.kind, self.topic, self.rate = producer, kind, topic, float(rate)
        self.send_every = max(float(send_every), 1.0 / self.rate)
        self.rng = np.random.default_rng(seed)
        self.stop_event = threading.Event()
        self.sent = self.acked = self.failed = 0
        self.first_error = None
        self._pool: list[bytes] = []

    def _ok(self, _meta):
        self.acked += 1          # callbacks run on the producer's one I/O thread

    def _err(self, exc):
        self.failed += 1
        self.first_error = self.first_error or repr(exc)

    def _next(self) -> bytes:
        if not self._pool:
            self._pool = encode(spec(self.kind).records(self.rng, 256))[::-1]
        return self._pool.pop()

    def run(self):
        t0 = time.monotonic()
        while not self.stop_event.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while self.sent < due:
                fut = self.producer.send(self.topic, value=self._next())
                fut.add_callback(self._ok)
                fut.add_errback(self._err)
                self.sent += 1
            self.stop_event.wait(self.send_every)


# ================================================================ the soak
def _mb(b):
    return "-" if b is None else f"{b / 2 ** 20:.0f}"


def sample_kind(d: DaemonProc, prod: SteadyProducer, t: float) -> dict:
    rc = d.proc.poll()
    produced = prod.acked
    rss, fds = proc_rss_fds(d.pid) if rc is None else (None, None)
    m = d.scrape() if rc is None else None
    if m is None and rc is None:            # one retry: a scrape that meets a busy moment
        m = d.scrape()
    acc = accounted(m)
    return {"t": round(t, 2), "alive": rc is None, "rc": rc, "rss": rss, "fds": fds,
            "cpu": proc_cpu_seconds(d.pid) if rc is None else None,
            "snapshots": count_snapshots(d.ck_dir),
            "checkpoints": None if m is None else m.get("streamsvi_checkpoints_total", 0.0),
            "lag": None if m is None else m.get("streamsvi_consumer_lag_records", 0.0),
            "produced": produced, "accounted": acc,
            "backlog": None if acc is None else max(0, produced - acc)}


def progress_line(t: float, samples: dict[str, dict]) -> str:
    parts = []
    for kind, s in samples.items():
        if not s["alive"]:
            parts.append(f"{kind} EXITED rc={s['rc']}")
            continue
        ck = "-" if s["checkpoints"] is None else int(s["checkpoints"])
        parts.append(f"{kind} {_mb(s['rss'])}M fd{s['fds']} ck{ck}"
                     f"/{s['snapshots']} lag{s['lag'] if s['lag'] is None else int(s['lag'])}"
                     f" bl{s['backlog']}")
    return f"[{t:6.0f}s] " + " | ".join(parts)


def _clean_up(daemons: dict, producers: dict, get_producer) -> None:
    """After a run, or when it stops early: producers stopped, daemons still running stopped
    (SIGTERM, then SIGKILL after 30 s), by pid."""
    for p in producers.values():
        p.stop_event.set()
    producer = get_producer()
    if producer is not None:
        try:
            producer.close(timeout=10)
        except Exception as exc:  # noqa: BLE001 - a producer that cannot flush must not keep daemons alive
            print(f"soak: producer close: {type(exc).__name__}: {exc}", file=sys.stderr)
    running = [d for d in daemons.values() if d.proc.poll() is None]
    for d in running:
        d.proc.send_signal(signal.SIGTERM)
    for d in running:
        try:
            d.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            d.proc.kill()
            d.proc.wait(timeout=10)


def _wait(cond, timeout_s: float, step_s: float = 0.25) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step_s)
    return cond()


def run_soak(minutes: float, kinds: list[str], rate: float, sample_seconds: float = 5.0,
             workdir: Path | None = None, rule: Rule = Rule(), drain_seconds: float = 120.0,
             checkpoint_seconds: float = 10.0, send_every: float = 0.5, log=print) -> dict:
    """Run the soak (module docstring); returns the summary (``summary["passed"]``)."""
    from kafka import KafkaProducer

    from streamsvi.checkpoint import load_snapshot
    from streamsvi.io import LocalBroker, create_topic
    from streamsvi.service.tomlw import dump_toml

    own_dir = workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="streamsvi-soak-")) if own_dir else Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    t_wall = time.monotonic()
    summary = {"minutes": minutes, "rate": rate, "send_every": send_every, "kinds": kinds,
               "sample_seconds": sample_seconds,
               "rule": asdict(rule), "workdir": str(workdir), "machine": {"cpus": os.cpu_count()},
               "per_kind": {}}
    daemons: dict[str, DaemonProc] = {}
    producers: dict[str, SteadyProducer] = {}
    series: dict[str, list] = {k: [] for k in kinds}
    broker_series = []
    producer = None
    with contextlib.ExitStack() as stack:
        broker = stack.enter_context(LocalBroker())
        stack.callback(_clean_up, daemons, producers, lambda: producer)   # before the broker stops
        bootstrap = broker.bootstrap
        for i, kind in enumerate(kinds):
            d = workdir / kind
            d.mkdir(exist_ok=True)
            topic = f"soak-{kind}"
            cfg = kind_config(kind, bootstrap=bootstrap, topic=topic, group=f"soak-{kind}",
                              directory=d / "ck", checkpoint_seconds=checkpoint_seconds,
                              batch_size=max(20, int(2 * rate)))
            check_records(cfg, encode(spec(kind).records(np.random.default_rng(100 + i), 200)))
            if not create_topic(bootstrap, topic, partitions=1):
                raise RuntimeError(f"could not create topic {topic}")
            (d / "config.toml").write_text(dump_toml(cfg))
        for kind in kinds:
            daemons[kind] = DaemonProc(kind, workdir / kind / "config.toml", workdir / kind / "ck")
        log(f"soak: {len(kinds)} daemons started ({', '.join(f'{k}={d.pid}' for k, d in daemons.items())});"
            f" broker {bootstrap}; workdir {workdir}")

        def ready():
            for d in daemons.values():
                if d.proc.poll() is not None:
                    raise RuntimeError(f"{d.kind} daemon exited ({d.proc.returncode}) at start:\n"
                                       f"{d.stderr_tail()}")
            return all(d.scrape() is not None for d in daemons.values())
        if not _wait(ready, 180.0, 0.5):
            raise RuntimeError("metrics endpoints did not answer within 180 s: "
                               + ", ".join(k for k, d in daemons.items() if d.scrape() is None))
        log(f"soak: every metrics endpoint answers after {time.monotonic() - t_wall:.0f} s; producing "
            f"{rate:g} records/s per kind for {minutes:g} min")

        producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=50,
                                 client_id="streamsvi-soak")
        for i, kind in enumerate(kinds):
            producers[kind] = SteadyProducer(producer, kind, f"soak-{kind}", rate, seed=i,
                                             send_every=send_every)
        t0 = time.monotonic()
        for p in producers.values():
            p.start()
        steady_s = minutes * 60.0
        next_t = t0
        while True:
            now = time.monotonic()
            t = now - t0
            row = {k: sample_kind(daemons[k], producers[k], t) for k in kinds}
            for k, s in row.items():
                series[k].append(s)
            b_rss, _ = proc_rss_fds(broker.proc.pid) if broker.proc else (None, None)
            broker_series.append([round(t, 2), b_rss, proc_cpu_seconds(broker.proc.pid) if broker.proc else None,
                               sum(os.times()[:2])])
            log(progress_line(t, row))
            if t >= steady_s:
                break
            next_t += sample_seconds
            time.sleep(max(0.0, min(next_t, t0 + steady_s) - time.monotonic()))

        for p in producers.values():
            p.stop_event.set()
        for p in producers.values():
            p.join(timeout=30)
        producer.flush(timeout=60)
        produced = {k: p.acked for k, p in producers.items()}
        log(f"soak: producers stopped after {time.monotonic() - t0:.0f} s: "
            + ", ".join(f"{k}={n}" for k, n in produced.items()) + "; draining")

        last = {}

        def drained():
            for k in kinds:
                if daemons[k].proc.poll() is not None:
                    continue
                last[k] = accounted(daemons[k].scrape())
            return all(last.get(k) == produced[k] or daemons[k].proc.poll() is not None for k in kinds)
        drain_ok = _wait(drained, drain_seconds, 1.0)
        t_drain = time.monotonic() - t0 - steady_s
        log(f"soak: drain {'done' if drain_ok else 'NOT done'} in {t_drain:.0f} s")
        final_scrape = {k: daemons[k].scrape() for k in kinds}

        for d in daemons.values():
            if d.proc.poll() is None:
                os.kill(d.pid, signal.SIGTERM)
        exits = {}
        for k, d in daemons.items():
            try:
                exits[k] = d.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                exits[k] = None
        log("soak: daemons stopped: " + ", ".join(f"{k} rc={rc}" for k, rc in exits.items()))

    all_pass = True
    for k in kinds:
        s = series[k]
        reasons, numbers = growth_verdict(s, rate, rule)
        scr = final_scrape.get(k) or {}
        acc = accounted(scr) if scr else last.get(k)
        if produced[k] == 0:
            reasons.append("nothing produced")
        if producers[k].failed or producers[k].sent != producers[k].acked:
            reasons.append(f"{producers[k].sent - producers[k].acked} of {producers[k].sent} records sent were "
                           f"not acknowledged by the broker ({producers[k].first_error})")
        if acc != produced[k]:
            reasons.append(f"after the drain accounted for {acc} of {produced[k]} records produced")
        if scr.get("streamsvi_records_dead_lettered_total"):
            reasons.append(f"{scr['streamsvi_records_dead_lettered_total']:g} records dead-lettered")
        if exits.get(k) != 0:
            reasons.append(f"exit status {exits.get(k)} after SIGTERM (want 0):\n{daemons[k].stderr_tail(1500)}")
        snap_info = {}
        try:
            snap = load_snapshot(daemons[k].ck_dir)
            end = sum(int(o["offset"]) for o in snap.offsets)
            held = int(scr.get("streamsvi_heldout_records", 0))
            snap_info = {"number": snap.number, "offsets_end": end, "records_seen": snap.records_seen,
                         "heldout": held}
            if end != produced[k]:
                reasons.append(f"last snapshot's offsets end at {end}, topic has {produced[k]}")
            if snap.records_seen + held != produced[k]:
                reasons.append(f"last snapshot: {snap.records_seen} records seen + {held} held out != "
                               f"{produced[k]} produced")
        except (FileNotFoundError, ValueError) as exc:
            reasons.append(f"no readable last snapshot: {exc}")
        live = [x for x in s if x["rss"] is not None]
        first, second = _halves(s, rule)
        stats = {
            "rss_first": live[0]["rss"] if live else None, "rss_last": live[-1]["rss"] if live else None,
            "rss_max": max((x["rss"] for x in live), default=None),
            "rss_med1": _median(x["rss"] for x in first), "rss_med2": _median(x["rss"] for x in second),
            "fds_first": live[0]["fds"] if live else None, "fds_last": live[-1]["fds"] if live else None,
            "checkpoints": None if not scr else int(scr.get("streamsvi_checkpoints_total", 0)),
            "max_snapshots": max((x["snapshots"] for x in s), default=0),
            "produced": produced[k], "accounted": acc,
            "consumed": None if not scr else int(scr.get("streamsvi_records_consumed_total", 0)),
            "max_lag": max((x["lag"] for x in s if x["lag"] is not None), default=None),
            "max_backlog": max((x["backlog"] for x in s if x["backlog"] is not None), default=None),
            "cpu_pct": _cpu_pct(first + second),
            "exit": exits.get(k), "snapshot": snap_info, **numbers,
        }
        summary["per_kind"][k] = {"passed": not reasons, "reasons": reasons, "stats": stats, "samples": s}
        all_pass &= not reasons
    summary["broker"] = broker_series          # [t, broker RSS, broker CPU s, this process's CPU s] per sample
    if (len(broker_series) >= 2 and broker_series[-1][0] > broker_series[0][0]
            and None not in broker_series[0] + broker_series[-1]):
        span = broker_series[-1][0] - broker_series[0][0]
        summary["broker_cpu_pct"] = round(100 * (broker_series[-1][2] - broker_series[0][2]) / span, 1)
        summary["soak_cpu_pct"] = round(100 * (broker_series[-1][3] - broker_series[0][3]) / span, 1)
        summary["broker_rss_mb"] = [round(broker_series[0][1] / 2 ** 20), round(broker_series[-1][1] / 2 ** 20)]
    summary["drain_seconds"] = round(t_drain, 1)
    summary["wall_seconds"] = round(time.monotonic() - t_wall, 1)
    summary["passed"] = all_pass
    if own_dir and all_pass:
        shutil.rmtree(workdir, ignore_errors=True)
    return summary


def _cpu_pct(samples) -> float | None:
    """CPU use (% of one core) between the first and the last of ``samples``."""
    pts = [(x["t"], x["cpu"]) for x in samples if x.get("cpu") is not None]
    if len(pts) < 2 or pts[-1][0] <= pts[0][0]:
        return None
    return 100.0 * (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])


def table(summary: dict) -> tuple[list, list]:
    header = ["kind", "RSS MB first", "med 1st/2nd half", "last", "max", "fds first/last", "ckpts (on disk)",
              "produced", "consumed+held", "max lag", "max backlog", "CPU %", "verdict"]
    rows = []
    for k, r in summary["per_kind"].items():
        st = r["stats"]
        rows.append([k, _mb(st["rss_first"]), f"{_mb(st['rss_med1'])}/{_mb(st['rss_med2'])}",
                     _mb(st["rss_last"]), _mb(st["rss_max"]), f"{st['fds_first']}/{st['fds_last']}",
                     f"{st['checkpoints']} ({st['max_snapshots']})", st["produced"], st["accounted"],
                     "-" if st["max_lag"] is None else int(st["max_lag"]), st["max_backlog"],
                     "-" if st["cpu_pct"] is None else f"{st['cpu_pct']:.1f}",
                     "pass" if r["passed"] else "FAIL"])
    return header, rows


def markdown(summary: dict) -> str:
    header, rows = table(summary)
    lines = [f"# streamsvi soak: {summary['minutes']:g} min, {summary['rate']:g} records/s per kind",
             "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    lines += ["", f"Verdict: {'PASS' if summary['passed'] else 'FAIL'}; wall time {summary['wall_seconds']:.0f} s; "
              f"rule {summary['rule']}"]
    for k, r in summary["per_kind"].items():
        for reason in r["reasons"]:
            lines.append(f"* {k}: {reason}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=60.0, help="steady phase, minutes (default 60)")
    p.add_argument("--kinds", help="comma-separated model kinds (default: every kind)")
    p.add_argument("--rate", type=float, default=20.0, help="records/s per kind (default 20)")
    p.add_argument("--sample-seconds", type=float, default=None,
                   help="seconds between samples (default: 5, or minutes*60/240 if larger)")
    p.add_argument("--checkpoint-seconds", type=float, default=10.0, help="checkpoint.every_seconds (10)")
    p.add_argument("--send-every", type=float, default=0.5,
                   help="seconds between a producer's sends: each sends the records due since its last "
                   "(default 0.5: 10 records per send at 20/s; the in-memory broker's CPU grows with the "
                   "number of record batches it holds)")
    p.add_argument("--drain-seconds", type=float, default=120.0, help="longest wait for the drain (120)")
    p.add_argument("--warmup", type=float, default=Rule.warmup)
    p.add_argument("--rss-mb", type=float, default=Rule.rss_mb)
    p.add_argument("--rss-frac", type=float, default=Rule.rss_frac)
    p.add_argument("--fd-slack", type=int, default=Rule.fd_slack)
    p.add_argument("--lag-seconds", type=float, default=Rule.lag_seconds)
    p.add_argument("--workdir", help="configs, checkpoints, daemon logs (default: a temporary directory, "
                   "removed after a pass)")
    p.add_argument("--out", help="write the summary as JSON here, and the table as markdown next to it (.md)")
    p.add_argument("--list-kinds", action="store_true", help="print the kinds and exit")
    a = p.parse_args(argv)
    if a.list_kinds:
        print(" ".join(all_kinds()))
        return 0
    missing = missing_kinds()
    if missing:
        print(f"soak: no soak spec for model kind(s) {missing}; add them to SPECS or give their classes a check case", file=sys.stderr)
        return 2
    kinds = all_kinds() if not a.kinds else [k.strip() for k in a.kinds.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in all_kinds()]
    if unknown or not kinds:
        p.error(f"--kinds: unknown {unknown}; choose from {', '.join(all_kinds())}")
    if a.minutes <= 0 or a.rate <= 0:
        p.error("--minutes and --rate must be > 0")
    sample_s = a.sample_seconds or max(5.0, a.minutes * 60 / 240)

    def interrupted(signum, _frame):     # run_soak's clean-up (kill the daemons, stop the broker) runs
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, interrupted)
    signal.signal(signal.SIGINT, interrupted)
    rule = Rule(warmup=a.warmup, rss_mb=a.rss_mb, rss_frac=a.rss_frac, fd_slack=a.fd_slack,
                lag_seconds=a.lag_seconds)
    summary = run_soak(a.minutes, kinds, a.rate, sample_s, Path(a.workdir) if a.workdir else None, rule,
                       a.drain_seconds, a.checkpoint_seconds, a.send_every, log=lambda s: print(s, flush=True))
    header, rows = table(summary)
    print()
    print(fmt_table(header, rows))
    print(f"\nsoak {'PASSED' if summary['passed'] else 'FAILED'}: {summary['minutes']:g} min at {summary['rate']:g} "
          f"records/s per kind, {len(kinds)} kinds, wall {summary['wall_seconds']:.0f} s, drain "
          f"{summary['drain_seconds']:.0f} s")
    if "broker_cpu_pct" in summary:
        print(f"broker (tansu, in-memory log): RSS {summary['broker_rss_mb'][0]} -> {summary['broker_rss_mb'][1]} MB, "
              f"CPU {summary['broker_cpu_pct']:.1f} %; this process (producers, sampler): CPU "
              f"{summary['soak_cpu_pct']:.1f} %")
    print(f"growth rule: after a {rule.warmup:.0%} warm-up, median(2nd half) - median(1st half): RSS <= "
          f"max({rule.rss_mb:g} MB, {rule.rss_frac:.0%}), fds <= {rule.fd_slack}, backlog and lag <= "
          f"max({rule.lag_floor}, {rule.lag_seconds:g} s x rate) records; snapshots on disk <= {rule.keep + 1}")
    for k, r in summary["per_kind"].items():
        for reason in r["reasons"]:
            print(f"  {k}: {reason}")
    if not summary["passed"]:
        print(f"  logs and checkpoints kept in {summary['workdir']}")
    if a.out:
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=1))
        out.with_suffix(".md").write_text(markdown(summary))
        print(f"summary: {out} and {out.with_suffix('.md')}")
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
