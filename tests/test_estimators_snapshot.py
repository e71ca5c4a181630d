"""Issue 26, item 1: every river face loads from a snapshot and scores like the library.

For each face: a snapshot the daemon wrote (file source) and one the face wrote
(``to_snapshot``) load with ``from_snapshot``; the loaded face predicts exactly what
``streamsvi.load(path)`` predicts (equal arrays), and learning goes on bit for bit as
the snapshot's engine would go on from its state (daemon) or as the writing face goes
on (face). ``repr`` is a few lines, fitted or loaded; a snapshot of another model is
refused with a message naming the face that loads it.
"""
import io
import json
import pickle

import numpy as np
import pandas as pd
import pytest

from streamsvi.checkpoint import CheckpointStore, load_snapshot
from streamsvi.datasets import make_blobs
from streamsvi.estimators import (GaussianMixture, GaussianMixture1D, HiddenMarkovModel, LogisticRegression,
                                  MatrixFactorization, PoissonFactorization, PoissonMixture,
                                  SoftmaxRegression, TopicModel, _docs)
from streamsvi.inference import SVI
from streamsvi.models import HPF, KnownVarianceGMM1D, Ratings
from streamsvi.models.hmm import sample_hmm
from streamsvi.models.hpf import sample_counts
from streamsvi.models.poisson_mixture import sample_mixture
from streamsvi.scoring import load
from streamsvi.sequence_batch import Sequences
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon

FACES = (GaussianMixture, TopicModel, MatrixFactorization, LogisticRegression, SoftmaxRegression, HiddenMarkovModel,
         PoissonFactorization, PoissonMixture, GaussianMixture1D)


# ------------------------------------------------------------------ data
def _points(n, seed):
    X, _ = make_blobs(n, seed=seed)
    return X


def _docs_of(n, seed, V=40):
    """Documents of two word groups (ids 0..V/2-1 and V/2..V-1), as {id: count} dicts."""
    rng = np.random.default_rng(seed)
    out = []
    for d in range(n):
        lo = 0 if d % 2 else V // 2
        ids = rng.choice(np.arange(lo, lo + V // 2), size=6, replace=False)
        out.append({int(i): int(c) for i, c in zip(ids, rng.integers(1, 4, size=6))})
    return out


def _ratings_of(n, seed):
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, 30, n), rng.integers(0, 12, n)
    y = np.clip(np.round(3 + np.where((u + i) % 2, 1.5, -1.5) + rng.normal(0, 0.3, n)), 1, 5)
    return [(int(a), int(b), float(c)) for a, b, c in zip(u, i, y)]


def _counts_of(n, seed):
    """(user, item, count) records: counts of two taste groups (Poisson 4 or 0.5), zeros included."""
    rng = np.random.default_rng(seed)
    u, i = rng.integers(0, 30, n), rng.integers(0, 12, n)
    y = rng.poisson(np.where((u + i) % 2, 4.0, 0.5))
    return [(int(a), int(b), float(c)) for a, b, c in zip(u, i, y)]


def _labelled(n, seed, classes=2, D=3):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    W = rng.normal(size=(classes, D)) * 2
    y = (X @ W.T).argmax(axis=1) if classes > 2 else (X @ W[0] > 0).astype(int)
    return X, y


def _sequences_of(n, seed):
    """Sequences of a 2-state HMM over 3 symbols, lengths 5..14, as lists."""
    A = np.array([[0.9, 0.1], [0.1, 0.9]])
    B = np.array([[0.8, 0.2, 0.0], [0.0, 0.2, 0.8]])
    rng = np.random.default_rng(seed)
    return sample_hmm(np.array([0.5, 0.5]), A, B, lengths=rng.integers(5, 15, size=n), rng=rng)[0].to_list()


def _frame(X, names):
    return pd.DataFrame(X, columns=list(names))


# ------------------------------------------------------------- the daemon
def _daemon_snapshot(tmp_path, kind, model, lines, batch_size, validation=None, inference=None):
    """Run the daemon on a file of JSON lines until it is drained; its checkpoint directory."""
    data = tmp_path / "records.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in lines))
    cfg = validate({
        "model": {"kind": kind, **model},
        "inference": {"n_total": 2000, "batch_size": batch_size, "seed": 0, **(inference or {})},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(tmp_path / "dead.jsonl")},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 1000},
        "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0},
        **({"validation": validation} if validation else {}),
    })
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained" and res.dead == 0, (res.stopped_by, res.dead)
    return tmp_path / "ck"


def _engine_goes_on(ck, batches):
    """The snapshot's own engine, from its state, one update per batch: (step, records, λ)."""
    snap = load_snapshot(ck)
    state = snap.state
    for b in batches:
        state, _ = snap.engine.update(state, b)
    return state


def _same_state(a, b):
    assert (a.step, a.records_seen) == (b.step, b.records_seen)
    assert sorted(a.lam) == sorted(b.lam)
    for k in a.lam:
        np.testing.assert_array_equal(np.asarray(a.lam[k]), np.asarray(b.lam[k]), err_msg=k)
    assert a.rng_state == b.rng_state


def _chunks(seq, size):
    return [seq[i:i + size] for i in range(0, len(seq), size)]


def test_gaussian_mixture_from_a_daemon_snapshot(tmp_path):
    X = _points(1000, seed=3)
    ck = _daemon_snapshot(tmp_path, "gmm", {"n_components": 3, "n_features": 2, "weight_concentration": 0.5,
                                            "mean_precision": 0.2, "scale": 1.0}, X[:600].tolist(), 100)
    est, fitted = GaussianMixture.from_snapshot(ck, features=("a", "b")), load(ck)
    Q = _frame(X[600:], "ab")
    np.testing.assert_array_equal(est.predict_many(Q).to_numpy(), fitted.predict(X[600:]))
    np.testing.assert_array_equal(est.predict_proba_many(Q).to_numpy(), fitted.responsibilities(X[600:]))
    np.testing.assert_array_equal(est.score_many(Q).to_numpy(), fitted.predictive_logpdf(X[600:]))
    assert [est.predict_one({"a": a, "b": b}) for a, b in X[600:700]] == fitted.predict(X[600:700]).tolist()
    assert est.score_one({"a": X[0, 0], "b": X[0, 1]}) == fitted.predictive_logpdf(X[:1])[0]
    assert (est._state.step, est._state.records_seen) == (fitted.step, fitted.records_seen) == (6, 600)
    est.learn_many(Q)                                           # 400 records: 4 updates of |S| = 100
    _same_state(est._state, _engine_goes_on(ck, _chunks(X[600:], 100)))


def test_topic_model_from_a_daemon_snapshot(tmp_path):
    docs = _docs_of(400, seed=1)
    lines = [{"ids": list(d), "counts": list(d.values())} for d in docs[:240]]
    ck = _daemon_snapshot(tmp_path, "lda", {"n_components": 2, "n_features": 40, "doc_topic_prior": 0.5,
                                            "topic_word_prior": 0.1}, lines, 40, validation={"max_abs": 100})
    est, fitted = TopicModel.from_snapshot(ck), load(ck)
    assert (est.n_components, est.n_features, est.batch_size) == (2, 40, 40)
    frame = pd.DataFrame(docs[240:]).fillna(0)
    X = _docs([est._row(d) for d in frame.to_dict(orient="records")], 40)     # the frame's documents
    words = np.asarray(X.sum(axis=1)).ravel()
    np.testing.assert_array_equal(est.transform_many(frame).to_numpy(), fitted.topic_proportions(X))
    np.testing.assert_array_equal(est.score_many(frame).to_numpy(), fitted.predictive_logpdf(X) / words)
    for d in docs[240:260]:                                     # one document: the library on that one
        one = _docs([est._row(d)], 40)
        assert list(est.transform_one(d).values()) == fitted.topic_proportions(one)[0].tolist()
        assert est.score_one(d) == fitted.predictive_logpdf(one)[0] / one.sum()
    assert np.isnan(est.score_one({}))
    for d in docs[240:]:
        est.learn_one(d)
    _same_state(est._state, _engine_goes_on(ck, [_docs([est._row(d) for d in c], 40)
                                                 for c in _chunks(docs[240:], 40)]))


def test_matrix_factorization_from_a_daemon_snapshot(tmp_path):
    ratings = _ratings_of(1600, seed=2)
    lines = [{"user": u, "item": i, "rating": y} for u, i, y in ratings[:1000]]
    ck = _daemon_snapshot(tmp_path, "pmf", {"n_factors": 2}, lines, 200,
                          validation={"min_rating": 1.0, "max_rating": 5.0})
    est, fitted = MatrixFactorization.from_snapshot(ck), load(ck)
    assert est.batch_size == 200 and est.n_factors == 2
    users, items = [u for u, _, _ in ratings[1000:]], [i for _, i, _ in ratings[1000:]]
    mean, var = fitted.predict_rating(users + [999], items + [0])        # 999: a user never seen
    np.testing.assert_array_equal(est.predict_many(users + [999], items + [0]), mean)
    np.testing.assert_array_equal(est.predict_var_many(users + [999], items + [0]), var)
    # one pair at a time: the library on that pair (after a few, from a table of moments: rounding only)
    one = np.array([fitted.predict_rating([u], [i]) for u, i in zip(users[:100], items[:100])])[:, :, 0]
    np.testing.assert_allclose([est.predict_one(u, i) for u, i in zip(users[:100], items[:100])], one[:, 0],
                               rtol=1e-14)
    np.testing.assert_allclose([est.predict_var_one(u, i) for u, i in zip(users[:100], items[:100])],
                               one[:, 1], rtol=1e-12)
    assert est.predict_sd_one(999, 0) == np.sqrt(var[-1])
    for u, i, r in ratings[1000:1010]:
        assert est.score_one(u, i, r) == fitted.predictive_logpdf(Ratings([u], [i], [r]))[0]
    assert est.recommend(users[0], k=3) == fitted.recommend(users[0], k=3)
    rated = {i for u, i, _ in ratings[:1000] if u == users[0]}
    assert not rated & {i for i, _ in est.recommend(users[0], k=12)}     # leaves out what the user rated
    for u, i, r in ratings[1000:]:
        est.learn_one(u, i, r)
    _same_state(est._state, _engine_goes_on(ck, [Ratings(*zip(*c)) for c in _chunks(ratings[1000:], 200)]))
    assert pickle.loads(pickle.dumps(est)).predict_one(users[0], items[0]) == est.predict_one(users[0], items[0])


def test_poisson_factorization_from_a_daemon_snapshot(tmp_path):
    counts = _counts_of(1600, seed=2)
    lines = [{"user": u, "item": i, "rating": y} for u, i, y in counts[:1000]]
    ck = _daemon_snapshot(tmp_path, "hpf", {"n_factors": 2}, lines, 200, validation={"min_rating": 0.0})
    est, fitted = PoissonFactorization.from_snapshot(ck), load(ck)
    assert est.batch_size == 200 and est.n_factors == 2 and est.row_counts == "scaled"   # the daemon's model
    users, items = [u for u, _, _ in counts[1000:]] + [999], [i for _, i, _ in counts[1000:]] + [0]
    mean, sd = fitted.predict_count(users, items)                        # 999: a user never seen
    np.testing.assert_array_equal(est.predict_many(users, items), mean)
    np.testing.assert_array_equal(est.predict_sd_many(users, items), sd)
    for u, i, y in counts[1000:1020] + [(999, 0, 2.0)]:                # one pair: the library on that pair
        m1, s1 = fitted.predict_count([u], [i])
        assert (est.predict_one(u, i), est.predict_sd_one(u, i)) == (m1[0], s1[0])
        assert est.score_one(u, i, y) == fitted.predictive_logpdf(Ratings([u], [i], [y]))[0]
    scored = fitted.score([{"user": u, "item": i} for u, i, _ in counts[1000:1010]])    # what streamsvi score writes
    assert [r["prediction"] for r in scored] == [est.predict_one(u, i) for u, i, _ in counts[1000:1010]]
    assert [r["sd"] for r in scored] == [est.predict_sd_one(u, i) for u, i, _ in counts[1000:1010]]
    with_counts = fitted.score([{"user": u, "item": i, "rating": y} for u, i, y in counts[1000:1010]])
    assert [r["log_density"] for r in with_counts] == [est.score_one(u, i, y) for u, i, y in counts[1000:1010]]
    assert est.recommend(users[0], k=3) == fitted.recommend(users[0], k=3)
    rated = {i for u, i, _ in counts[:1000] if u == users[0]}
    assert not rated & {i for i, _ in est.recommend(users[0], k=12)}     # leaves out what the user has
    top = est.recommend(users[0], k=12)
    assert [i for i, _ in top] == [str(i) for i in est.rank(users[0], [int(i) for i, _ in top])]
    for u, i, y in counts[1000:]:
        est.learn_one(u, i, y)
    _same_state(est._state, _engine_goes_on(ck, [Ratings(*zip(*c)) for c in _chunks(counts[1000:], 200)]))
    assert pickle.loads(pickle.dumps(est)).predict_one(users[0], items[0]) == est.predict_one(users[0], items[0])


def test_poisson_mixture_from_a_daemon_snapshot(tmp_path):
    X, _, _ = sample_mixture(1000, seed=3)
    ck = _daemon_snapshot(tmp_path, "poisson_mixture", {"n_components": 3, "n_features": 5}, X[:600].tolist(), 100)
    names = ("a", "b", "c", "d", "e")
    est, fitted = PoissonMixture.from_snapshot(ck, features=names), load(ck)
    assert (est.n_components, est.batch_size, est.features) == (3, 100, names)
    Q = _frame(X[600:], names)
    np.testing.assert_array_equal(est.predict_many(Q).to_numpy(), fitted.predict(X[600:]))
    np.testing.assert_array_equal(est.predict_proba_many(Q).to_numpy(), fitted.responsibilities(X[600:]))
    np.testing.assert_array_equal(est.score_many(Q).to_numpy(), fitted.predictive_logpdf(X[600:]))
    for row in X[600:650]:                                      # one record: the library on that one
        x = dict(zip(names, row))
        assert est.predict_one(x) == fitted.predict(row[None])[0]
        assert list(est.predict_proba_one(x).values()) == fitted.responsibilities(row[None])[0].tolist()
        assert est.score_one(x) == fitted.predictive_logpdf(row[None])[0]
    scored = fitted.score(X[600:610])
    assert [r["assignment"] for r in scored] == est.predict_many(Q[:10]).tolist()
    assert PoissonMixture.from_snapshot(ck).features == ("x0", "x1", "x2", "x3", "x4")
    assert (est._state.step, est._state.records_seen) == (fitted.step, fitted.records_seen) == (6, 600)
    est.learn_many(Q)                                           # 400 records: 4 updates of |S| = 100
    _same_state(est._state, _engine_goes_on(ck, _chunks(X[600:], 100)))


def _line_of(n, seed):
    """n values of three 1-D clusters (-4, 0.5, 5; sd 1), the gauss1d records."""
    rng = np.random.default_rng(seed)
    return rng.choice([-4.0, 0.5, 5.0], size=n) + rng.normal(size=n)


def test_gaussian_mixture_1d_from_a_daemon_snapshot(tmp_path):
    x = _line_of(1000, seed=3)
    ck = _daemon_snapshot(tmp_path, "gauss1d", {"n_components": 3, "sigma2": 1.0, "prior_var": 25.0},
                          [[v] for v in x[:600]], 100)
    est, fitted = GaussianMixture1D.from_snapshot(ck, feature="v"), load(ck)
    assert (est.n_components, est.batch_size, est.feature, est.prior_var) == (3, 100, "v", 25.0)
    X, Q = x[600:, None], _frame(x[600:, None], "v")
    np.testing.assert_array_equal(est.predict_many(Q).to_numpy(), fitted.predict(X))
    np.testing.assert_array_equal(est.predict_proba_many(Q).to_numpy(), fitted.responsibilities(X))
    np.testing.assert_array_equal(est.score_many(Q).to_numpy(), fitted.predictive_logpdf(X))
    for v in x[600:650]:                                        # one record: the library on that one
        assert est.predict_one({"v": v}) == fitted.predict([[v]])[0]
        assert list(est.predict_proba_one({"v": v}).values()) == fitted.responsibilities([[v]])[0].tolist()
        assert est.score_one({"v": v}) == fitted.predictive_logpdf([[v]])[0]
    assert GaussianMixture1D.from_snapshot(ck).feature == "x0"
    assert (est._state.step, est._state.records_seen) == (fitted.step, fitted.records_seen) == (6, 600)
    est.learn_many(Q)                                           # 400 records: 4 updates of |S| = 100
    _same_state(est._state, _engine_goes_on(ck, _chunks(X, 100)))


@pytest.mark.parametrize("cls, classes", [(LogisticRegression, 2), (SoftmaxRegression, 3)])
def test_classifier_from_a_daemon_snapshot(tmp_path, cls, classes):
    X, y = _labelled(1400, seed=4, classes=classes)
    lines = [{"x": a.tolist(), "y": int(b)} for a, b in zip(X[:800], y[:800])]
    kind, model = ("logistic", {"n_features": 3}) if classes == 2 else ("softmax", {"n_features": 3,
                                                                                    "n_classes": 3})
    ck = _daemon_snapshot(tmp_path, kind, model, lines, 100)
    est, fitted = cls.from_snapshot(ck, features=("p", "q", "r")), load(ck)
    assert est.standardize is False and est.batch_size == 100
    Q = _frame(X[800:], "pqr")
    got = est.predict_proba_many(Q).to_numpy()
    want = fitted.predict_proba(X[800:])
    want = np.column_stack([1 - want, want]) if classes == 2 else want
    np.testing.assert_array_equal(got, want)
    one = np.array([list(est.predict_proba_one(dict(zip("pqr", a))).values()) for a in X[800:900]])
    np.testing.assert_allclose(one, want[:100], rtol=0, atol=1e-12)     # plain-float sums: rounding only
    labels = [bool(v) for v in y[800:]] if classes == 2 else [int(v) for v in y[800:]]
    est.learn_many(Q, pd.Series(labels))
    rows = np.column_stack([X[800:], y[800:].astype(float)])
    _same_state(est._state, _engine_goes_on(ck, _chunks(rows, 100)))


def test_hidden_markov_model_from_a_daemon_snapshot(tmp_path):
    seqs = _sequences_of(500, seed=3)
    ck = _daemon_snapshot(tmp_path, "hmm", {"n_components": 2, "n_symbols": 3}, seqs[:300], 50)
    est, fitted = HiddenMarkovModel.from_snapshot(ck), load(ck)
    assert (est.n_states, est.n_symbols, est.batch_size) == (2, 3, 50)
    rest = seqs[300:]
    np.testing.assert_array_equal(est.score_many(rest), fitted.log_likelihood(rest))
    assert est.predict_many(rest) == [p.tolist() for p in fitted.viterbi(rest)]
    for x in rest[:20]:                                         # one sequence: the library on that one
        assert est.score_one(x) == fitted.log_likelihood([x])[0]
        assert est.predict_one(x) == fitted.viterbi([x])[0].tolist()
        np.testing.assert_array_equal(est.predict_proba_one(x), fitted.filtering([x])[0])
    assert est.score_one([]) == 0.0 and est.predict_one([]) == []
    est.learn_many(rest)
    _same_state(est._state, _engine_goes_on(ck, [Sequences.from_list(c) for c in _chunks(rest, 50)]))


def test_hidden_markov_model_refuses_bad_symbols_and_works_before_its_first_update():
    est = HiddenMarkovModel(n_states=2, n_symbols=3, batch_size=4, seed=0)
    assert np.isnan(est.score_one([0, 1])) and est.predict_one([0, 1, 2]) == [0, 0, 0]
    np.testing.assert_array_equal(est.predict_proba_one([0, 1]), np.full((2, 2), 0.5))
    for bad, why in (([0, 3], r"symbols must be in 0\.\.2 \(n_symbols=3\), got 3"),
                     ([0.5], "symbols must be integers"), ("abc", "flat list of integer symbols"),
                     ([[0], [1, 2]], "flat list of integer symbols")):
        with pytest.raises(ValueError, match=why):
            est.learn_one(bad)
    with pytest.raises(ValueError, match="got -1"):
        est.learn_many([[0, 1], [2, -1]])                      # checked before any is learned
    assert est._learner.unlearned() == []
    est.learn_many(_sequences_of(8, seed=0))                  # two minibatches: two steps
    assert est._state.step == 2 and est._state.records_seen == 8
    est2 = pickle.loads(pickle.dumps(est))
    assert est2.score_one([0, 2, 2]) == est.score_one([0, 2, 2])


# ------------------------------------------------ the face's own snapshots
def _fit(cls, n_extra):
    """A fitted face, the records it learned from a second part of the stream, and a learn function."""
    if cls is GaussianMixture:
        X = _points(400 + n_extra, seed=5)
        face = cls(n_components=3, batch_size=16, seed=0)
        learn = lambda f, part: [f.learn_one({"a": a, "b": b}) for a, b in part]       # noqa: E731
        score = lambda f, part: (f.predict_many(_frame(part, "ab")).to_numpy(),        # noqa: E731
                                 f.score_many(_frame(part, "ab")).to_numpy())
        library = lambda fit, part: (fit.predict(part), fit.predictive_logpdf(part))   # noqa: E731
        return face, X[:400], X[400:], learn, score, library
    if cls is TopicModel:
        docs = _docs_of(300 + n_extra, seed=6)
        words = tuple(f"w{i}" for i in range(40))
        named = [{words[k]: v for k, v in d.items()} for d in docs]
        face = cls(n_components=2, n_features=64, vocabulary=words, batch_size=20, seed=0,
                   doc_topic_prior=0.5, topic_word_prior=0.1)
        learn = lambda f, part: [f.learn_one(d) for d in part]                          # noqa: E731
        score = lambda f, part: (np.array([list(f.transform_one(d).values()) for d in part]),  # noqa: E731
                                 np.array([f.score_one(d) for d in part]))

        def library(fit, part):                                 # one document at a time, as the face
            X = [_docs([face._row(d)], 64) for d in part]
            return (np.array([fit.topic_proportions(x)[0] for x in X]),
                    np.array([fit.predictive_logpdf(x)[0] / x.sum() for x in X]))
        return face, named[:300], named[300:], learn, score, library
    if cls is MatrixFactorization:
        ratings = _ratings_of(900 + n_extra, seed=7)
        face = cls(n_factors=2, batch_size=100, seed=1)
        learn = lambda f, part: [f.learn_one(*r) for r in part]                         # noqa: E731
        score = lambda f, part: (f.predict_many(                                        # noqa: E731
                                 [r[0] for r in part], [r[1] for r in part]),
                                 np.array([f.score_one(u, i, y) for u, i, y in part]))

        def library(fit, part):
            u, i, _ = map(list, zip(*part))
            return (fit.predict_rating(u, i)[0],
                    np.array([fit.predictive_logpdf(Ratings([a], [b], [y]))[0] for a, b, y in part]))
        return face, ratings[:900], ratings[900:], learn, score, library
    if cls is HiddenMarkovModel:
        seqs = _sequences_of(300 + n_extra, seed=9)
        face = cls(n_states=2, n_symbols=3, batch_size=20, n_total=300, seed=0)
        learn = lambda f, part: [f.learn_one(x) for x in part]                          # noqa: E731
        score = lambda f, part: (f.score_many(part), f.predict_many(part))              # noqa: E731
        library = lambda fit, part: (fit.log_likelihood(part), [p.tolist() for p in fit.viterbi(part)])  # noqa: E731
        return face, seqs[:300], seqs[300:], learn, score, library
    if cls is PoissonFactorization:
        counts = _counts_of(900 + n_extra, seed=7)
        face = cls(n_factors=2, batch_size=100, seed=1)
        learn = lambda f, part: [f.learn_one(*r) for r in part]                         # noqa: E731
        score = lambda f, part: (f.predict_many([r[0] for r in part], [r[1] for r in part]),  # noqa: E731
                                 f.predict_sd_many([r[0] for r in part], [r[1] for r in part]),
                                 np.array([f.score_one(u, i, y) for u, i, y in part]),
                                 [f.recommend(u, k=3) for u in range(5)])

        def library(fit, part):
            u, i, _ = map(list, zip(*part))
            return (*fit.predict_count(u, i),
                    np.array([fit.predictive_logpdf(Ratings([a], [b], [y]))[0] for a, b, y in part]),
                    [fit.recommend(v, k=3) for v in range(5)])
        return face, counts[:900], counts[900:], learn, score, library
    if cls is PoissonMixture:
        X, _, _ = sample_mixture(400 + n_extra, seed=5)
        names = ("a", "b", "c", "d", "e")
        face = cls(n_components=3, batch_size=16, seed=0)
        data = [dict(zip(names, r)) for r in X.tolist()]
        learn = lambda f, part: [f.learn_one(x) for x in part]                          # noqa: E731
        score = lambda f, part: (f.predict_many(pd.DataFrame(part)).to_numpy(),        # noqa: E731
                                 f.predict_proba_many(pd.DataFrame(part)).to_numpy(),
                                 f.score_many(pd.DataFrame(part)).to_numpy())

        def library(fit, part):
            Z = np.array([[x[c] for c in names] for x in part])
            return fit.predict(Z), fit.responsibilities(Z), fit.predictive_logpdf(Z)
        return face, data[:400], data[400:], learn, score, library
    if cls is GaussianMixture1D:
        x = _line_of(400 + n_extra, seed=5)
        face = cls(n_components=3, batch_size=16, seed=0)
        data = [{"v": float(v)} for v in x]
        learn = lambda f, part: [f.learn_one(r) for r in part]                          # noqa: E731
        score = lambda f, part: (f.predict_many(pd.DataFrame(part)).to_numpy(),        # noqa: E731
                                 f.predict_proba_many(pd.DataFrame(part)).to_numpy(),
                                 f.score_many(pd.DataFrame(part)).to_numpy())

        def library(fit, part):
            Z = np.array([[r["v"]] for r in part])
            return fit.predict(Z), fit.responsibilities(Z), fit.predictive_logpdf(Z)
        return face, data[:400], data[400:], learn, score, library
    classes = 2 if cls is LogisticRegression else 3
    X, y = _labelled(500 + n_extra, seed=8, classes=classes)
    X = X * [1.0, 10.0, 100.0] + [0.0, 5.0, -50.0]              # raw units: the face standardises
    labels = [bool(v) for v in y] if classes == 2 else [f"c{v}" for v in y]
    face = cls(batch_size=16, seed=0)
    data = [(dict(zip("pqr", a.tolist())), b) for a, b in zip(X, labels)]
    learn = lambda f, part: [f.learn_one(x, t) for x, t in part]                        # noqa: E731
    score = lambda f, part: (f.predict_proba_many(pd.DataFrame([x for x, _ in part])).to_numpy(),)  # noqa: E731

    def library(fit, part):
        Z = np.array([[x[c] for c in "pqr"] for x, _ in part])
        Z = face._transform(Z, *face._moments.current())      # the face's standardisation at the save
        p = fit.predict_proba(Z)
        assert classes == 2 or p.shape[1] == len(face._classes) == 3      # all seen: no renormalising
        return (np.column_stack([1 - p, p]) if classes == 2 else p),
    return face, data[:500], data[500:], learn, score, library


@pytest.mark.parametrize("cls", FACES)
def test_a_face_written_snapshot_round_trips(tmp_path, cls):
    """Fit, save mid-minibatch, load: the same predictions as the face and as streamsvi.load, and
    the same λ, step, records and random stream after learning more, bit for bit."""
    face, first, rest, learn, score, library = _fit(cls, n_extra=250)
    learn(face, first[:-3])                                     # 3 records short: an unfinished minibatch
    learn(face, first[-3:])
    path = face.to_snapshot(tmp_path / "ck")
    loaded, fitted = cls.from_snapshot(tmp_path / "ck"), load(tmp_path / "ck")
    assert fitted.path == path and loaded.batch_size == face.batch_size
    for a, b, c in zip(score(face, rest), score(loaded, rest), library(fitted, rest)):
        _equal(a, b)
        _equal(b, c)
    learn(face, rest)
    learn(loaded, rest)
    _same_state(face._state, loaded._state)
    assert len(face._learner.buffer) == len(loaded._learner.buffer)
    for a, b in zip(score(face, first[:50]), score(loaded, first[:50])):
        _equal(a, b)


def _equal(a, b):
    """Equal arrays, or equal lists (state paths of several lengths)."""
    if isinstance(a, list):
        assert a == b
    else:
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("cls", FACES)
def test_repr_is_a_few_lines_fitted_or_loaded(tmp_path, cls):
    face, first, _, learn, _, _ = _fit(cls, n_extra=0)
    assert repr(type(face)()) == f"{cls.__name__}()"
    learn(face, first)
    face.to_snapshot(tmp_path)
    for f in (face, cls.from_snapshot(tmp_path)):
        text = repr(f)
        assert text.startswith(cls.__name__) and len(text) <= 1000 and text.count("\n") < 10, text
        assert "seed" not in text or f is face


def test_repr_shortens_a_long_vocabulary_and_shows_only_changed_settings():
    words = tuple(f"word{i}" for i in range(5000))
    text = repr(TopicModel(n_components=20, n_features=8192, vocabulary=words, kappa=0.7, tau0=64.0))
    assert text == ("TopicModel(\n    n_components=20, n_features=8192, vocabulary=<5000 items: 'word0', "
                    "'word1', 'word2', …>,\n    tau0=64.0\n)")
    assert repr(GaussianMixture(n_components=2, seed=3)) == "GaussianMixture(n_components=2, seed=3)"


def test_a_snapshot_of_another_model_is_refused_with_the_face_that_loads_it(tmp_path):
    X = _points(200, seed=9)
    g = GaussianMixture(n_components=2, batch_size=50, seed=0)
    g.learn_many(_frame(X, "ab"))
    g.to_snapshot(tmp_path / "gmm")
    for cls in (TopicModel, MatrixFactorization, LogisticRegression, SoftmaxRegression):
        with pytest.raises(ValueError, match=r"holds a 'gmm' model, not .*; load it with "
                                             r"streamsvi\.estimators\.GaussianMixture\.from_snapshot"):
            cls.from_snapshot(tmp_path / "gmm")
    s = SoftmaxRegression(batch_size=8, seed=0)
    for a, b in zip(*_labelled(40, seed=1, classes=3)):
        s.learn_one(dict(zip("pqr", a)), int(b))
    s.to_snapshot(tmp_path / "softmax")
    with pytest.raises(ValueError, match="holds a 'softmax' model, not a binary logistic regression; "
                                         "load it with streamsvi.estimators.SoftmaxRegression"):
        LogisticRegression.from_snapshot(tmp_path / "softmax")
    engine = SVI(HPF(n_factors=2), n_total=200)
    counts = sample_counts()
    state, _ = engine.update(engine.init(counts, seed=0), counts)
    CheckpointStore(tmp_path / "hpf").save(engine, state, offsets=[])
    with pytest.raises(ValueError, match=r"holds a 'hpf' model, not a probabilistic matrix factorisation "
                                         r"\(PMF\); load it with streamsvi\.estimators\.PoissonFactorization"
                                         r"\.from_snapshot"):
        MatrixFactorization.from_snapshot(tmp_path / "hpf")
    assert PoissonFactorization.from_snapshot(tmp_path / "hpf").state.step == 1
    m = MatrixFactorization(n_factors=2, batch_size=8, seed=0)
    for r in _ratings_of(16, seed=0):
        m.learn_one(*r)
    m.to_snapshot(tmp_path / "pmf")
    with pytest.raises(ValueError, match=r"holds a 'pmf' model, not a Poisson factorisation \(HPF\); load it "
                                         r"with streamsvi\.estimators\.MatrixFactorization\.from_snapshot"):
        PoissonFactorization.from_snapshot(tmp_path / "pmf")
    with pytest.raises(ValueError, match=r"holds a 'gmm' model, not a Poisson mixture; load it with "
                                         r"streamsvi\.estimators\.GaussianMixture\.from_snapshot"):
        PoissonMixture.from_snapshot(tmp_path / "gmm")
    pm = PoissonMixture(n_components=2, batch_size=20, seed=0)
    pm.learn_many(_frame(sample_mixture(100, seed=0)[0], "abcde"))
    pm.to_snapshot(tmp_path / "pm")
    with pytest.raises(ValueError, match=r"holds a 'poisson_mixture' model, not a Gaussian mixture; load it "
                                         r"with streamsvi\.estimators\.PoissonMixture\.from_snapshot"):
        GaussianMixture.from_snapshot(tmp_path / "pm")
    engine = SVI(KnownVarianceGMM1D(2), n_total=200)               # the daemon's gauss1d
    x = np.concatenate([np.full(20, -3.0), np.full(20, 3.0)]) + np.linspace(-0.5, 0.5, 40)
    state, _ = engine.update(engine.init(x, seed=0), x)
    CheckpointStore(tmp_path / "g1").save(engine, state, offsets=[])
    with pytest.raises(ValueError, match=r"holds a 'gauss1d' model, not a Gaussian mixture; load it with "
                                         r"streamsvi\.estimators\.GaussianMixture1D\.from_snapshot"):
        GaussianMixture.from_snapshot(tmp_path / "g1")
    assert GaussianMixture1D.from_snapshot(tmp_path / "g1").state.step == 1
    with pytest.raises(ValueError, match=r"holds a 'gmm' model, not a 1-D Gaussian mixture; load it with "
                                         r"streamsvi\.estimators\.GaussianMixture\.from_snapshot"):
        GaussianMixture1D.from_snapshot(tmp_path / "gmm")


def test_to_snapshot_before_the_first_update_says_why(tmp_path):
    face = GaussianMixture(n_components=2, batch_size=50, seed=0)
    face.learn_one({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="has learned nothing yet"):
        face.to_snapshot(tmp_path)
    face.learn_many(_frame(_points(300, seed=0), "ab"))
    face.to_snapshot(tmp_path)
    with pytest.raises(ValueError, match="features has 3 names, the snapshot's model has 2"):
        GaussianMixture.from_snapshot(tmp_path, features=("a", "b", "c"))
    with pytest.raises(ValueError, match="features has 1 names, the snapshot's model has 2"):
        LogisticRegression.from_snapshot(_logistic_snapshot(tmp_path / "lr"), features=("a",))


def _logistic_snapshot(directory):
    face = LogisticRegression(batch_size=8, seed=0)
    X, y = _labelled(40, seed=2, D=2)
    for a, b in zip(X, y):
        face.learn_one(dict(zip("ab", a)), bool(b))
    face.to_snapshot(directory)
    return directory
