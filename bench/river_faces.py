"""The river faces against the river estimators they stand in for, in memory, on the same records.

For each face of :mod:`streamsvi.estimators` and its river peer, records/s of
``learn_one``, ``learn_many``, ``predict_one`` (``transform_one`` for the
topic model), ``predict_proba_one`` and ``predict_many``, on the same records,
printed with the ratio streamsvi / river (the goal: >= 1.0 on every row).

=====================  ================================  =====================================
face                   river peer                        records
=====================  ================================  =====================================
LogisticRegression     linear_model.LogisticRegression   Phishing (1,250 × 9; river's wheel)
SoftmaxRegression      linear_model.SoftmaxRegression    ImageSegments (2,310 × 18; river's)
GaussianMixture (K=7)  cluster.KMeans (n_clusters=7)     ImageSegments (speed only)
MatrixFactorization    reco.BiasedMF (n_factors=5)       MovieLens 100K, first ``--ratings``
TopicModel (K=10)      preprocessing.LDA (K=10)          NYT, first ``--docs`` documents
=====================  ================================  =====================================

Both sides use their defaults (the peers' sizes set to the face's). The
``learn_one`` and ``learn_many`` timings start from a fresh estimator; the
predictions are timed on an estimator that has learned every record.
``learn_many`` / ``predict_many`` take DataFrames of ``--chunk`` rows (made
before the clock starts). Where river has no ``*_many`` method, the river
column is its ``*_one`` loop over the same records (marked ``*``). Methods
are alternated (which side goes first alternates by round) and each figure
is the median of ``--rounds`` rounds. ``OPENBLAS_NUM_THREADS=1`` for both sides (set
below before numpy is imported): the matrices are small, and BLAS threads that wait on
a loaded 2-core machine made the mixture's rates swing 6× from one run to the next.

Not the same work on every row: river's ``LogisticRegression.learn_many`` takes one
SGD step per call (per chunk), the face one engine update per ``batch_size`` records
(16 per chunk of 256), as its ``learn_one`` does; and the predictions are timed under
one state, which ``MatrixFactorization.predict_one``'s per-state table of the rows'
moments favours (under a stream of updates it is rebuilt once per state, when enough
predictions ask for it).

    nice -n 10 .venv/bin/python bench/river_faces.py            # every face (~3 min on 2 cores)
    nice -n 10 .venv/bin/python bench/river_faces.py --only logistic,softmax
    PYTHONPATH=/path/to/other/checkout .venv/bin/python bench/river_faces.py   # another version

The first line names the streamsvi that ran.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import cpu_model, fmt_table  # noqa: E402


def _chunks(seq, n):
    return [seq[i:i + n] for i in range(0, len(seq), n)]


def _frames(xs, ys, chunk):
    import pandas as pd

    out = []
    for i in range(0, len(xs), chunk):
        X = pd.DataFrame(xs[i:i + chunk])
        out.append((X, None if ys is None else pd.Series(ys[i:i + chunk], index=X.index)))
    return out


# ------------------------------------------------------------------ the faces
def _classifier(face, peer, data, chunk):
    xs = [x for x, _ in data]
    ys = [y for _, y in data]
    frames = _frames(xs, ys, chunk)

    def learn_one(make):
        m = make()
        learn = m.learn_one
        for x, y in data:
            learn(x, y)
        return m

    def learn_many(make):
        m = make()
        if not hasattr(m, "learn_many"):
            return learn_one(make), True
        for X, y in frames:
            m.learn_many(X, y)
        return m, False

    def predict_one(m):
        p = m.predict_one
        for x in xs:
            p(x)

    def proba_one(m):
        p = m.predict_proba_one
        for x in xs:
            p(x)

    def predict_many(m):
        if not hasattr(m, "predict_many"):
            predict_one(m)
            return True
        for X, _ in frames:
            m.predict_many(X)
        return False

    return len(data), {"learn_one": learn_one, "learn_many": learn_many, "predict_one": predict_one,
                       "predict_proba_one": proba_one, "predict_many": predict_many}, (face, peer)


def _unsupervised(face, peer, xs, frames, one="predict_one", many="predict_many"):
    """The timed methods of a face without labels: ``one``/``many`` its prediction methods
    (``transform_one``/``transform_many`` for the topic model)."""

    def learn_one(make):
        m = make()
        learn = m.learn_one
        for x in xs:
            learn(x)
        return m

    def learn_many(make):
        m = make()
        if not hasattr(m, "learn_many"):
            return learn_one(make), True
        for X, _ in frames:
            m.learn_many(X)
        return m, False

    def predict_one(m):
        p = getattr(m, one)
        for x in xs:
            p(x)

    def predict_many(m):
        if not hasattr(m, many):
            predict_one(m)
            return True
        for X, _ in frames:
            getattr(m, many)(X)
        return False

    return len(xs), {"learn_one": learn_one, "learn_many": learn_many, "predict_one": predict_one,
                     "predict_many": predict_many}, (face, peer)


def _clusterer(face, peer, xs, chunk):
    return _unsupervised(face, peer, xs, _frames(xs, None, chunk))


def _topics(face, peer, docs, chunk):
    frames = [(X.fillna(0.0), None) for X, _ in _frames(docs, None, chunk)]     # counts, 0 = absent
    return _unsupervised(face, peer, docs, frames, "transform_one", "transform_many")


def _ratings(face, peer, triples):
    def learn_one(make):
        m = make()
        learn = m.learn_one
        for u, i, y in triples:
            learn(u, i, y)
        return m

    def predict_one(m):
        p = m.predict_one
        for u, i, _ in triples:
            p(u, i)

    return len(triples), {"learn_one": learn_one, "predict_one": predict_one}, (face, peer)


def setups(only, args):
    """(name, (n records, methods, (make face, make peer)))) of the faces asked for."""
    from river import cluster, datasets, linear_model, preprocessing, reco

    from streamsvi import estimators as est

    if "logistic" in only:
        data = list(datasets.Phishing())
        yield "LogisticRegression / linear_model.LogisticRegression (Phishing)", _classifier(
            lambda: est.LogisticRegression(seed=0), linear_model.LogisticRegression, data, args.chunk)
    if "softmax" in only:
        data = list(datasets.ImageSegments())
        yield "SoftmaxRegression / linear_model.SoftmaxRegression (ImageSegments)", _classifier(
            lambda: est.SoftmaxRegression(seed=0), linear_model.SoftmaxRegression, data, args.chunk)
    if "gmm" in only:
        xs = [x for x, _ in datasets.ImageSegments()]
        yield "GaussianMixture(K=7) / cluster.KMeans(7) (ImageSegments)", _clusterer(
            lambda: est.GaussianMixture(n_components=7, n_total=len(xs), seed=0),
            lambda: cluster.KMeans(n_clusters=7, seed=0), xs, args.chunk)
    if "pmf" in only:
        from streamsvi.datasets import load_movielens100k

        r = load_movielens100k()
        n = min(args.ratings, len(r.rating))
        triples = [(u, i, float(y)) for u, i, y in zip(r.user[:n].tolist(), r.item[:n].tolist(),
                                                       r.rating[:n].tolist())]
        yield f"MatrixFactorization / reco.BiasedMF (MovieLens 100K, {n:,} ratings)", _ratings(
            lambda: est.MatrixFactorization(seed=0), lambda: reco.BiasedMF(n_factors=5, seed=0), triples)
    if "lda" in only:
        from streamsvi.datasets import load_nyt

        X, words = load_nyt()
        X = X[:args.docs].tocsr()
        docs = [{words[j]: float(c) for j, c in zip(X.indices[X.indptr[d]:X.indptr[d + 1]],
                                                   X.data[X.indptr[d]:X.indptr[d + 1]])}
                for d in range(X.shape[0])]
        docs = [d for d in docs if d]
        V = len(words)
        yield f"TopicModel(K=10) / preprocessing.LDA(10) (NYT, {len(docs):,} documents)", _topics(
            lambda: est.TopicModel(n_components=10, n_features=V, vocabulary=tuple(words),
                                   n_total=len(docs), seed=0),
            lambda: preprocessing.LDA(n_components=10, number_of_documents=len(docs), seed=0),
            docs, args.chunk)


def _median_rates(n, methods, makers, rounds):
    """{method: (face rec/s, peer rec/s, peer used its *_one)}: medians of alternated rounds."""
    times = {m: ([], [], [False]) for m in methods}
    fitted = [None, None]
    for r in range(rounds):
        order = (0, 1) if r % 2 == 0 else (1, 0)
        for name, fn in methods.items():
            for side in order:
                make = makers[side]
                t0 = time.perf_counter()
                if name.startswith("learn"):
                    out = fn(make)
                    fallback = isinstance(out, tuple) and out[1]
                    model = out[0] if isinstance(out, tuple) else out
                    if name == "learn_one":
                        fitted[side] = model
                else:
                    fallback = bool(fn(fitted[side]))
                times[name][side].append(time.perf_counter() - t0)
                if side == 1 and fallback:
                    times[name][2][0] = True
    return {m: (n / statistics.median(a), n / statistics.median(b), fb[0]) for m, (a, b, fb) in times.items()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--only", default="logistic,softmax,gmm,pmf,lda",
                   help="comma list of logistic, softmax, gmm, pmf, lda (default: all)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--chunk", type=int, default=256, help="rows per learn_many / predict_many call")
    p.add_argument("--ratings", type=int, default=20_000, help="MovieLens ratings (pmf)")
    p.add_argument("--docs", type=int, default=300, help="NYT documents (lda)")
    args = p.parse_args(argv)
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    import river

    import streamsvi

    print(f"streamsvi {streamsvi.__version__} ({Path(streamsvi.__file__).parent}), river {river.__version__}, "
          f"{cpu_model()}; medians of {args.rounds} alternated rounds, chunks of {args.chunk}")
    rows = []
    for title, (n, methods, makers) in setups(only, args):
        res = _median_rates(n, methods, makers, args.rounds)
        for m, (a, b, fb) in res.items():
            rows.append([title if m == "learn_one" else "", m, f"{a:,.0f}", f"{b:,.0f}" + (" *" if fb else ""),
                         f"{a / b:.2f}"])
        print(f"done: {title}", file=sys.stderr, flush=True)
    print(fmt_table(["face / river peer (records)", "method", "streamsvi rec/s", "river rec/s", "ratio"],
                    rows, left=2))
    print("* river has no such method: its *_one loop over the same records")


if __name__ == "__main__":
    main()
