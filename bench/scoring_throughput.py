"""``streamsvi score`` against in-memory scoring of the same records (records/s and ratios).

For each model (GMM D = 8, K = 10; PMF d = 10 on 2,000 users × 1,000 items;
LDA K = 20, V = 2,000): fit with SVI, save a snapshot with the real
checkpoint store, load it back with ``streamsvi.load`` and write the records
as a JSON-lines file. Then, in each round, methods alternated:

``in-memory``     the model's vectorised method on the decoded records, in
                  chunks of ``--chunk``: ``fitted.predictive_logpdf`` (GMM, LDA),
                  ``fitted.predict_rating`` (PMF, unrated pairs)
``score_block``   ``fitted.score_block`` on the decoded records, in the same chunks:
                  every output ``streamsvi score`` writes, as columns
``cli``           ``streamsvi score --input F --output G`` run in this process
                  (``streamsvi.cli.main``; interpreter start-up and imports not
                  counted): read, decode, validate, score, write JSON lines
``dicts``         the per-record path for comparison: ``LineScorer(...)(lines)``
                  and ``json.dumps`` of each dict (what ``streamsvi score`` did before)
``cli density``   GMM only: ``streamsvi score --scores log_density``, the same output
                  as ``in-memory`` computes (the predictive density alone), against it

Printed: the median records/s of each over the rounds, and ``cli`` divided by
``in-memory`` and by ``score_block`` (medians of the per-round ratios).

Run: ``python bench/scoring_throughput.py [--quick] [--rounds 5] [--only gmm,pmf,lda]``.
BLAS is pinned to one thread (small matrices on 2 cores are faster that way).
"""
import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import io  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import streamsvi  # noqa: E402
from streamsvi.checkpoint import CheckpointStore  # noqa: E402
from streamsvi.cli import main as cli_main  # noqa: E402
from streamsvi.datasets import make_lda_corpus  # noqa: E402
from streamsvi.inference import SVI, RobbinsMonro  # noqa: E402
from streamsvi.io.records import record_kind  # noqa: E402
from streamsvi.models import LDA, PMF, BayesianGMM  # noqa: E402
from streamsvi.scoring import LineScorer  # noqa: E402


def gmm_case(n):
    rng = np.random.default_rng(0)
    D, K = 8, 10
    centers = rng.normal(0, 4, (K, D))
    X = (centers[rng.integers(0, K, n)] + rng.normal(size=(n, D))).round(6)
    engine = SVI(BayesianGMM(K, D), n_total=n, schedule=RobbinsMonro(1.0, 0.7))
    state, _ = engine.fit(engine.init(X[:1000], seed=0), X, n_steps=30, batch_size=1000)
    return "GMM (D=8, K=10)", engine, state, X, lambda f, x: f.predictive_logpdf(x)


def pmf_case(n):
    x = PMF.synthetic_ratings(n_users=2000, n_items=1000, n=n, d=10, seed=0, noise=0.3)
    engine = SVI(PMF(n_factors=10, offset=3.0), n_total=n)
    state = engine.init(x[np.arange(5000)], seed=0)
    for lo in range(0, n, 5000):
        state, _ = engine.update(state, x[np.arange(lo, min(n, lo + 5000))])
    unrated = x[np.arange(n)]
    unrated.rating[:] = np.nan                       # score pairs without their rating
    return "PMF (d=10), unrated pairs", engine, state, unrated, lambda f, r: f.predict_rating(r.user, r.item)


def lda_case(n):
    X, _, _ = make_lda_corpus(n, 20, 2000, doc_length=60, seed=0)
    engine = SVI(LDA(20, 2000), n_total=n)
    state, _ = engine.fit(engine.init(X[:500], seed=0), X, n_steps=10, batch_size=500)
    return "LDA (K=20, V=2000)", engine, state, X, lambda f, x: f.predictive_logpdf(x)


CASES = {"gmm": (gmm_case, 100_000, 20_000), "pmf": (pmf_case, 100_000, 20_000),
         "lda": (lda_case, 5_000, 1_000)}


def json_lines(fitted, x) -> list[str]:
    """The records as the JSON lines ``streamsvi score`` reads (a ratings pair without its rating)."""
    kind = record_kind(fitted.model)
    values = kind.to_json(x)
    if kind.name == "ratings":
        values = [{"user": v["user"], "item": v["item"]} for v in values]
    return [json.dumps(v) for v in values]


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run_case(name, n, rounds, chunk):
    title, engine, state, x, vectorised = CASES[name][0](n)
    with tempfile.TemporaryDirectory() as d:
        CheckpointStore(d).save(engine, state, offsets=[])
        fitted = streamsvi.load(d)
        kind = record_kind(fitted.model)
        inp, out = Path(d) / "in.jsonl", Path(d) / "out.jsonl"
        lines = json_lines(fitted, x)
        inp.write_text("\n".join(lines) + "\n")
        chunks = [kind.take(x, np.arange(lo, min(n, lo + chunk))) for lo in range(0, n, chunk)]
        numbered = list(enumerate(lines, 1))
        scorer = LineScorer(fitted, "jsonl")

        def cli(*extra, dest=out):
            with contextlib.redirect_stderr(io.StringIO()):
                code = cli_main(["score", "--snapshot", d, "--input", str(inp), "--output", str(dest),
                                 "--chunk", str(chunk), *extra])
            assert code == 0, code

        def dicts():
            for lo in range(0, n, chunk):
                "\n".join(json.dumps(r) for r in scorer(numbered[lo:lo + chunk]))

        methods = {"in-memory": lambda: [vectorised(fitted, c) for c in chunks],
                   "score_block": lambda: [fitted.score_block(c) for c in chunks],
                   "cli": cli, "dicts": dicts}
        if name == "gmm":
            methods["cli density"] = lambda: cli("--scores", "log_density", dest=Path(d) / "density.jsonl")
        seconds = {m: [] for m in methods}
        for r in range(rounds):
            order = list(methods) if r % 2 == 0 else list(methods)[::-1]     # alternate the order
            for m in order:
                seconds[m].append(timed(methods[m]))
            print(f"  {name} round {r + 1}/{rounds}: " + ", ".join(f"{m} {n / seconds[m][-1]:,.0f}/s"
                                                                 for m in methods), file=sys.stderr, flush=True)
        assert sum(1 for _ in out.open()) == n           # one output line per record
    rate = {m: statistics.median(n / s for s in seconds[m]) for m in methods}
    vs_mem = statistics.median(a / b for a, b in zip(seconds["in-memory"], seconds["cli"]))
    vs_block = statistics.median(a / b for a, b in zip(seconds["score_block"], seconds["cli"]))
    density = None
    if "cli density" in seconds:
        density = statistics.median(a / b for a, b in zip(seconds["in-memory"], seconds["cli density"]))
    return title, n, rate, vs_mem, vs_block, density


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer records (a smoke run)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk", type=int, default=10_000, help="records per block (the CLI's --chunk)")
    ap.add_argument("--only", default="gmm,pmf,lda", help="comma-separated models: gmm, pmf, lda")
    args = ap.parse_args()
    rows = []
    for name in args.only.split(","):
        _, full, quick = CASES[name]
        print(f"{name}: fitting and writing {quick if args.quick else full} records ...", file=sys.stderr,
              flush=True)
        rows.append(run_case(name, quick if args.quick else full, args.rounds, args.chunk))
    print(f"\nstreamsvi score vs in-memory scoring of the same records; chunks of {args.chunk}, "
          f"median of {args.rounds} alternated rounds; numpy {np.__version__}\n")
    print("| model | records | in-memory /s | score_block /s | streamsvi score /s | dicts + json.dumps /s "
          "| score ÷ in-memory | score ÷ score_block |")
    print("|---|---|---|---|---|---|---|---|")
    for title, n, rate, vs_mem, vs_block, density in rows:
        print(f"| {title} | {n:,} | {rate['in-memory']:,.0f} | {rate['score_block']:,.0f} | {rate['cli']:,.0f} "
              f"| {rate['dicts']:,.0f} | {vs_mem:.2f} | {vs_block:.2f} |")
        if density is not None:
            print(f"| {title}, `--scores log_density` | {n:,} | {rate['in-memory']:,.0f} | – "
                  f"| {rate['cli density']:,.0f} | – | {density:.2f} | – |")


if __name__ == "__main__":
    main()
