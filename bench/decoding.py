"""JSON decoding rate (records/s) of every record kind: a baseline's decoders against this checkout's.

Issue 27, item 3: JSON bag-of-words and the other JSON kinds decode at least
3× faster than before, with the same dead-letter reasons. This bench measures
the first half; ``tests/io/test_decode_fast.py`` and
``tests/io/test_fuzz_decoders.py`` pin the second.

Records (realistic, fixed seeds; the data sets are read from streamsvi's cache
when they are there, never fetched: a synthetic stand-in of the same shape
otherwise, and the table says which):

* ``dense``      GMM records, D = 8 floats at full precision (``json.dumps`` of
                 float64 draws of a 10-cluster mixture), :class:`JsonCodec`;
* ``bow``        NYT bag-of-words documents (8447 × 3012, seed 002 Table 1),
                 ``{"ids": [...], "counts": [...]}``, :class:`BowJsonCodec`;
                 else LDA-generated documents of the same size;
* ``labelled``   river's Phishing stream (bundled with river), 9 features and
                 the label, ``{"x": [...], "y": 1}``, :class:`LabelledJsonCodec`;
* ``ratings``    MovieLens 100K, ``{"user": "196", "item": "242", "rating": 3.0}``
                 (the codec's own encoding: ids as strings); ``ratings-int``
                 the same with integer ids, as a producer writing the raw
                 columns sends them; else synthetic ratings;
* ``sequences``  DNA splice sequences (60 symbols of 4), ``[1, 3, 0, ...]``,
                 :class:`SequenceJsonCodec`; else random sequences of that shape.

Every message is written by the kind's own JSON encoder (what streamsvi's
producers send: ``json.dumps`` spacing).

Two measures per kind, on runs of ``--run`` messages (1000, one partition's
fetch at |S| = 1000):

* ``decode_many``  the codec's ``decode_many`` of one run (the fast path of a source);
* ``builder``      the sources' ``_BatchBuilder.add_run`` + ``batch()`` of one
                   run: decoding, validation and batch assembly, as a source
                   does it (each side with its own builder and validator).

The baseline runs in this process: its ``streamsvi`` package is extracted from
git (``git archive <ref>``, default the commit before issue 27's decoding
work) and imported under another module name (``streamsvi_baseline``) with
importlib, so both sides see the same interpreter, the same machine load and
the same records. Methods are alternated within a round (baseline, new, in
chunks of ``--chunk`` seconds until each has run ``--min-time``); a rate is
records / the method's own time; the table gives the medians over
``--repeats`` rounds (default 3) and the ratio of the medians. Both sides'
outputs are compared on the corpus before anything is timed.

Run::

    python bench/decoding.py                     # ~1 min
    python bench/decoding.py --quick             # ~15 s
    python bench/decoding.py --ref <commit>      # another baseline
    python bench/decoding.py --baseline DIR      # a baseline already extracted (DIR/streamsvi)
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import cpu_model, fmt_table  # noqa: E402

#: the last commit before issue 27's decoding work: "today" of the issue
DEFAULT_REF = "32b8366"
KINDS = ("dense", "bow", "labelled", "ratings", "ratings-int", "sequences")


# ------------------------------------------------------------------ baseline
def extract_baseline(ref: str, into: Path) -> Path:
    """``git archive ref streamsvi`` unpacked under ``into``; returns the package directory."""
    repo = Path(__file__).resolve().parent.parent
    tar = subprocess.run(["git", "-C", str(repo), "archive", ref, "streamsvi"], capture_output=True)
    if tar.returncode:
        raise SystemExit(f"git archive {ref} failed: {tar.stderr.decode().strip()}")
    with tarfile.open(fileobj=io.BytesIO(tar.stdout)) as t:
        try:
            t.extractall(into, filter="data")
        except TypeError:                      # Python < 3.11.4: no extraction filters
            t.extractall(into)
    return into / "streamsvi"


def import_as(package_dir: Path, name: str):
    """The package at ``package_dir`` imported as ``name`` (its relative imports follow)."""
    spec = importlib.util.spec_from_file_location(name, package_dir / "__init__.py",
                                                  submodule_search_locations=[str(package_dir)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# -------------------------------------------------------------------- records
def _cached(*parts) -> Path | None:
    from streamsvi.datasets import cache_dir
    p = cache_dir().joinpath(*parts)
    return p if p.exists() else None


def corpus(kind: str, n: int, seed: int = 0):
    """(payloads, what they are, codec factory args) for ``kind``: n messages."""
    from streamsvi import datasets
    from streamsvi.io.bow import BowJsonCodec
    from streamsvi.io.dense import JsonCodec
    from streamsvi.io.labelled import LabelledJsonCodec
    from streamsvi.io.ratings import RatingsJsonCodec
    from streamsvi.io.sequences import SequenceJsonCodec

    rng = np.random.default_rng(seed)
    if kind == "dense":
        means = rng.normal(scale=5.0, size=(10, 8))
        X = means[rng.integers(0, 10, n)] + rng.normal(size=(n, 8))
        c = JsonCodec(8)
        return [c.encode(r) for r in X], "GMM draws, D = 8 (synthetic mixture)", 8
    if kind == "bow":
        if _cached("nyt", "nyt.ldac") and _cached("nyt", "nyt.tokens"):
            X, _ = datasets.load_nyt()
            what = f"NYT bag of words ({X.shape[0]} × {X.shape[1]})"
        else:
            X, _, _ = datasets.make_lda_corpus(n_docs=2000, n_topics=20, n_words=3012, doc_length=330,
                                               seed=seed)
            what = "LDA-generated documents, V = 3012 (NYT not in the cache)"
        X = X.tocsr()
        c = BowJsonCodec(X.shape[1])
        docs = [c.encode_rows(X[i]) for i in range(X.shape[0])]
        return [docs[i % len(docs)] for i in range(n)], what, X.shape[1]
    if kind == "labelled":
        from river import datasets as river_datasets
        rows = [list(x.values()) + [int(y)] for x, y in river_datasets.Phishing()]
        c = LabelledJsonCodec(len(rows[0]) - 1)
        msgs = [c.encode_rows(np.array(r, dtype=float)) for r in rows]
        return [msgs[i % len(msgs)] for i in range(n)], f"river Phishing ({len(rows)} records, 9 features)", \
            len(rows[0]) - 1
    if kind in ("ratings", "ratings-int"):
        import json
        if _cached("ml-100k", "ml-100k.inter"):
            R = datasets.load_movielens100k()
            users, items, ys = R.user[:n], R.item[:n], R.rating[:n]
            what = "MovieLens 100K"
        else:
            users = rng.integers(1, 944, n).astype(str)
            items = rng.integers(1, 1683, n).astype(str)
            ys = rng.integers(1, 6, n).astype(float)
            what = "synthetic ratings (MovieLens not in the cache)"
        if kind == "ratings":
            c = RatingsJsonCodec()
            from streamsvi.ratings_batch import Ratings
            msgs = [c.encode_rows(Ratings([u], [i], [y])) for u, i, y in zip(users, items, ys)]
            what += ", ids as strings"
        else:
            msgs = [json.dumps({"user": int(u), "item": int(i), "rating": float(y)}).encode()
                    for u, i, y in zip(users, items, ys)]
            what += ", integer ids"
        return [msgs[i % len(msgs)] for i in range(n)], what, None
    if kind == "sequences":
        c = SequenceJsonCodec()
        if _cached("DNA-decoded.npz") or _cached("DNA.rda"):
            try:
                S, _ = datasets.load_dna_splice()
                seqs = [S[i] for i in range(len(S))]
                what = f"DNA splice ({len(seqs)} sequences of 60 symbols)"
            except ImportError:
                seqs = None
        else:
            seqs = None
        if seqs is None:
            seqs = [rng.integers(0, 4, 60) for _ in range(2000)]
            what = "random sequences, 60 symbols of 4 (DNA not in the cache)"
        msgs = [c.encode(s) for s in seqs]
        return [msgs[i % len(msgs)] for i in range(n)], what, None
    raise ValueError(kind)


def make(pkg, kind: str, arg):
    """(codec, validator, record kind) of package ``pkg`` (streamsvi or the baseline)."""
    io_ = importlib.import_module(pkg.__name__ + ".io")
    if kind == "dense":
        return io_.dense.JsonCodec(arg), io_.dense.RecordValidator(arg), io_.dense.DenseKind()
    if kind == "bow":
        return io_.bow.BowJsonCodec(arg), io_.bow.BowValidator(arg), io_.bow.BowKind()
    if kind == "labelled":
        return (io_.labelled.LabelledJsonCodec(arg), io_.labelled.LabelledValidator(arg),
                io_.labelled.LabelledKind())
    if kind.startswith("ratings"):
        return io_.ratings.RatingsJsonCodec(), io_.ratings.RatingsValidator(), io_.ratings.RatingsKind()
    return io_.sequences.SequenceJsonCodec(), io_.sequences.SequenceValidator(4), io_.sequences.SequencesKind()


def as_plain(part):
    """A decoded part as numpy arrays, comparable across the two packages' classes."""
    if hasattr(part, "tocsr"):
        X = part.tocsr()
        return [X.shape, X.indptr, X.indices, X.data]
    if hasattr(part, "offsets"):
        return [part.offsets, part.symbols]
    if hasattr(part, "user"):
        return [np.asarray(part.user.tolist()), np.asarray(part.item.tolist()), part.rating]
    return [part]


def same(a, b) -> bool:
    pa, pb = as_plain(a), as_plain(b)
    return len(pa) == len(pb) and all(
        (x == y) if isinstance(x, tuple) else (np.asarray(x).dtype == np.asarray(y).dtype
                                                and np.array_equal(x, y))
        for x, y in zip(pa, pb))


# ------------------------------------------------------------------- timing
def timed_rounds(methods: dict, n_records: int, repeats: int, min_time: float, chunk: float) -> dict:
    """{name: [records/s per round]}: methods alternated in chunks within every round."""
    rates = {name: [] for name in methods}
    for _ in range(repeats):
        spent = dict.fromkeys(methods, 0.0)
        calls = dict.fromkeys(methods, 0)
        while min(spent.values()) < min_time:
            for name, fn in methods.items():
                t_end = time.perf_counter() + chunk
                while True:
                    t0 = time.perf_counter()
                    fn()
                    t1 = time.perf_counter()
                    spent[name] += t1 - t0
                    calls[name] += 1
                    if t1 >= t_end:
                        break
        for name in methods:
            rates[name].append(calls[name] * n_records / spent[name])
    return rates


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of {', '.join(KINDS)}")
    ap.add_argument("--ref", default=DEFAULT_REF, help="git commit of the baseline decoders")
    ap.add_argument("--baseline", default=None, help="a directory holding the baseline's streamsvi/")
    ap.add_argument("--run", type=int, default=1000, help="messages per decode_many call (a fetch)")
    ap.add_argument("--runs", type=int, default=8, help="distinct runs cycled through")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-time", type=float, default=1.0, help="seconds per method per round")
    ap.add_argument("--chunk", type=float, default=0.1)
    ap.add_argument("--quick", action="store_true", help="--min-time 0.25, --runs 4")
    args = ap.parse_args(argv)
    if args.quick:
        args.min_time, args.runs = 0.25, 4
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind {k!r}; choose from {', '.join(KINDS)}")

    import orjson

    import streamsvi
    from streamsvi.io.sources.base import _BatchBuilder

    with tempfile.TemporaryDirectory() as tmp:
        if args.baseline:
            base_dir, base_what = Path(args.baseline) / "streamsvi", f"directory {args.baseline}"
        else:
            base_dir, base_what = extract_baseline(args.ref, Path(tmp)), f"git {args.ref}"
        base = import_as(base_dir, "streamsvi_baseline")
        BaseBuilder = importlib.import_module("streamsvi_baseline.io.sources.base")._BatchBuilder

        print(f"JSON decoding, records/s. CPU: {cpu_model()}; Python {sys.version.split()[0]}, "
              f"numpy {np.__version__}, orjson {orjson.__version__}")
        print(f"baseline: {base_what} (imported as streamsvi_baseline); new: this checkout. Runs of "
              f"{args.run} messages; medians of {args.repeats} rounds, methods alternated in "
              f"{args.chunk} s chunks, {args.min_time} s each per round.\n")
        rows, notes = [], []
        for kind in kinds:
            payloads, what, arg = corpus(kind, args.run * args.runs)
            runs = [payloads[i * args.run:(i + 1) * args.run] for i in range(args.runs)]
            sides = {"baseline": (base, BaseBuilder), "new": (streamsvi, _BatchBuilder)}
            decs, builds, parts = {}, {}, {}
            for side, (pkg, Builder) in sides.items():
                codec, validator, rk = make(pkg, kind, arg)
                parts[side] = [codec.decode_many(r) for r in runs]
                batches = []
                for r in runs:
                    b = Builder(codec, validator, getattr(codec, "n_features", None), kind=rk)
                    b.add_run("t", 0, range(len(r)), r)
                    batches.append(b.batch())
                parts[side + "-batch"] = batches
                it = {"i": 0}

                def dec(codec=codec, it=it):
                    codec.decode_many(runs[it["i"] % len(runs)])
                    it["i"] += 1

                def build(codec=codec, validator=validator, rk=rk, Builder=Builder, it=it):
                    r = runs[it["i"] % len(runs)]
                    it["i"] += 1
                    b = Builder(codec, validator, getattr(codec, "n_features", None), kind=rk)
                    b.add_run("t", 0, range(len(r)), r)
                    b.batch()

                decs[side], builds[side] = dec, build
            ok = all(a is not None and same(a, b) for a, b in zip(parts["baseline"], parts["new"]))
            ok_b = all(same(a.x, b.x) and [(d.reason, d.message) for d in a.dead]
                       == [(d.reason, d.message) for d in b.dead]
                       for a, b in zip(parts["baseline-batch"], parts["new-batch"]))
            r_dec = timed_rounds(decs, args.run, args.repeats, args.min_time, args.chunk)
            r_bld = timed_rounds(builds, args.run, args.repeats, args.min_time, args.chunk)
            md = {k: float(np.median(v)) for k, v in r_dec.items()}
            mb = {k: float(np.median(v)) for k, v in r_bld.items()}
            size = np.mean([len(p) for p in payloads])

            def spread(r):
                per_round = np.array(r["new"]) / np.array(r["baseline"])
                return f"{per_round.min():.2f}–{per_round.max():.2f}"

            rows.append([kind, f"{size:.0f}", f"{md['baseline']:,.0f}", f"{md['new']:,.0f}",
                         f"{md['new'] / md['baseline']:.2f}", spread(r_dec), f"{mb['baseline']:,.0f}",
                         f"{mb['new']:,.0f}", f"{mb['new'] / mb['baseline']:.2f}", spread(r_bld),
                         "yes" if ok and ok_b else "NO"])
            notes.append(f"{kind}: {what}")
            print(f"  {kind} done", file=sys.stderr)
        print(fmt_table(["kind", "bytes/rec", "decode_many base", "decode_many new", "×", "rounds",
                         "builder base", "builder new", "×", "rounds", "same"], rows))
        print("\nrecords: " + "; ".join(notes))
        print("× = new / baseline (ratio of the medians); rounds: the lowest and highest ratio of one "
              "round. Only the two sides of one measure ran alternated, so compare rates within a pair. "
              "same: both sides decode every run to the same part, and their builders give the same batch "
              "and dead letters.")


if __name__ == "__main__":
    main()
