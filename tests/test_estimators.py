"""The river faces (clusterer, topic transformer, ranker): river's own checks, dataset checks,
pickling and deepcopy, learn_many == learn_one, snapshots."""
import copy
import io
import json
import pickle

import numpy as np
import pandas as pd
import pytest
from river import checks
from river.checks import common

from streamsvi.checkpoint import CheckpointStore
from streamsvi.datasets import make_blobs
from streamsvi.estimators import GaussianMixture, HiddenMarkovModel, MatrixFactorization, TopicModel
from streamsvi.inference import SVI
from streamsvi.models import BayesianGMM
from streamsvi.scoring import load
from streamsvi.service.config import validate
from streamsvi.service.daemon import Daemon


def _stream(n=300, seed=0):
    X, _ = make_blobs(n, seed=seed)
    return [({"u": float(a), "v": float(b), "w": float(a - b), "z": float(a + b)}, None) for a, b in X]


@pytest.mark.parametrize("params", list(GaussianMixture._unit_test_params()))
def test_river_check_estimator(params):
    checks.check_estimator(GaussianMixture(**params))


@pytest.mark.parametrize("check", [common.check_learn_one, common.check_pickling,
                                   common.check_shuffle_features_no_impact,
                                   common.check_emerging_features, common.check_disappearing_features,
                                   common.check_radically_disappearing_features,
                                   common.check_predict_one_pure,
                                   common.check_predict_one_before_any_learn,
                                   common.check_no_state_aliasing_with_input,
                                   common.check_clone_is_independent])
def test_river_dataset_checks(check):
    """river runs these only for estimator kinds it has data sets for; we give it one."""
    check(GaussianMixture(n_components=3, batch_size=16, seed=0), dataset=_stream())


def test_learn_many_matches_learn_one():
    data = _stream(200)
    a = GaussianMixture(n_components=3, batch_size=25, effective_batch_size=10, seed=3)
    b = GaussianMixture(n_components=3, batch_size=25, effective_batch_size=10, seed=3)
    for x, _ in data:
        a.learn_one(x)
    b.learn_many(pd.DataFrame([x for x, _ in data]))
    assert a._state.lam.array_equal(b._state.lam)
    df = pd.DataFrame([x for x, _ in data[:50]])
    assert b.predict_many(df).tolist() == [a.predict_one(x) for x, _ in data[:50]]


@pytest.mark.parametrize("init_batches, n_start", [(1, 40), (2, 40), (3, 60), (5, 100)])
def test_streaming_start_waits_for_its_records_as_the_daemon_does(init_batches, n_start):
    """The first updates wait for start_size records (init_batches minibatches of 20, at
    least 5·K·D = 30, so whole batches: 40 for 1 or 2), start from all of them, then step
    through each held batch: the same λ, bit for bit, as the engine run by hand that way."""
    from streamsvi import SVI, BayesianGMM, RobbinsMonro

    X, _ = make_blobs(200, seed=7)
    est = GaussianMixture(n_components=3, batch_size=20, n_total=200, seed=9, init_batches=init_batches,
                          features=("a", "b"))
    for a, b in X[:n_start - 1]:
        est.learn_one({"a": a, "b": b})
    assert est._state is None and est.predict_one({"a": 0.0, "b": 0.0}) == 0
    for a, b in X[n_start - 1:]:
        est.learn_one({"a": a, "b": b})
    model = BayesianGMM(3, 2, init_batches=init_batches)
    eng = SVI(model, n_total=200, schedule=RobbinsMonro(tau0=1.0, kappa=0.7), short_batches="svi")
    state = eng.init(X[:n_start], seed=9)
    for i in range(0, 200, 20):
        state, _ = eng.update(state, X[i:i + 20])
    assert est._state.step == state.step == 10
    assert est._state.lam.array_equal(state.lam)
    other = eng.init(X[:20], seed=9)                 # the first minibatch alone: another start
    assert not other.lam.array_equal(eng.init(X[:n_start], seed=9).lam)


def test_clusters_are_found():
    X, labels = make_blobs(2000, seed=4)
    est = GaussianMixture(n_components=4, batch_size=100, n_total=2000, seed=0)
    for _ in range(3):
        for a, b in X:
            est.learn_one({"a": a, "b": b})
    pred = np.array([est.predict_one({"a": a, "b": b}) for a, b in X])
    agree = sum(np.bincount(pred[labels == k]).max() for k in range(4)) / len(X)
    assert agree > 0.9
    p = est.predict_proba_one({"a": 0.0, "b": 4.0})
    assert sum(p.values()) == pytest.approx(1.0) and np.isfinite(est.score_one({"a": 0.0, "b": 4.0}))


def test_from_snapshot_predicts_like_the_snapshot(tmp_path):
    X, _ = make_blobs(400, seed=1)
    engine = SVI(BayesianGMM(4, 2, weight_concentration=0.5, mean_precision=0.2, scale=1.0),
                 n_total=400, effective_batch_size=20)
    state, _ = engine.fit(engine.init(X, seed=0), X, n_steps=30, batch_size=50)
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    est = GaussianMixture.from_snapshot(tmp_path, features=("a", "b"))
    fitted = load(tmp_path)
    assert [est.predict_one({"a": a, "b": b}) for a, b in X[:100]] == fitted.predict(X[:100]).tolist()
    assert est._state.step == 30
    est.learn_many(pd.DataFrame(X[:64], columns=["a", "b"]))    # and it keeps learning
    assert est._state.step == 32
    with pytest.raises(ValueError, match="features has 3 names"):
        GaussianMixture.from_snapshot(tmp_path, features=("a", "b", "c"))


# ------------------------------------------------------------ TopicModel (LDA)
def test_topic_model_river_checks_and_batching():
    import pandas as pd

    from streamsvi.estimators import TopicModel

    for params in TopicModel._unit_test_params():
        checks.check_estimator(TopicModel(**params))
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(12)]
    docs = [{w: int(rng.integers(1, 4)) for w in rng.choice(words[:6] if i % 2 else words[6:], 4,
                                                               replace=False)} for i in range(60)]
    a, b = (TopicModel(n_components=2, n_features=32, vocabulary=tuple(words), batch_size=10,
                       n_total=60, seed=3) for _ in range(2))
    for d in docs:
        a.learn_one(d)
    b.learn_many(pd.DataFrame(docs).fillna(0))
    np.testing.assert_array_equal(a.topics(), b.topics())     # same batches, same result
    out = a.transform_many(pd.DataFrame(docs[:5]).fillna(0))
    assert list(out.columns) == ["topic_0", "topic_1"] and np.allclose(out.sum(axis=1), 1.0)
    assert a.transform_one({"unknown": 3}) == {"topic_0": 0.5, "topic_1": 0.5}   # no known word
    with pytest.raises(ValueError, match="finite and > 0"):
        a.learn_one({"w1": -2})
    with pytest.raises(ValueError, match="more than n_features"):
        TopicModel(n_features=2, vocabulary=("a", "b", "c"))


# ------------------------------------------------------- every river face: checks, pickle, deepcopy
_FACES = [pytest.param(cls, params, id=f"{cls.__name__}-{i}")
          for cls in (GaussianMixture, TopicModel, MatrixFactorization)
          for i, params in enumerate(cls._unit_test_params())]


@pytest.mark.parametrize("cls,params", _FACES)
def test_every_face_passes_river_check_estimator(cls, params):
    """river's whole generic suite (check_pickling_supports_roundtrip, clone, repr, ... and, for
    the ranker, check_reco_routine)."""
    checks.check_estimator(cls(**params))


def _feed(est, n, seed):
    """Enough data of the face's kind for a few updates plus a partial batch in the buffer."""
    rng = np.random.default_rng(seed)
    if isinstance(est, MatrixFactorization):
        for _ in range(n):
            u, i = int(rng.integers(12)), int(rng.integers(9))
            est.learn_one(f"u{u}", i, 4.0 if (u + i) % 2 else 2.0)
    elif isinstance(est, HiddenMarkovModel):
        for _ in range(n):
            est.learn_one(rng.integers(0, 3, size=int(rng.integers(2, 9))).tolist())
    elif isinstance(est, TopicModel):
        words = [f"w{k}" for k in range(16)]
        for k in range(n):
            est.learn_one({w: 2 for w in rng.choice(words[:8] if k % 2 else words[8:], 3, replace=False)})
    else:
        for x, _ in _stream(n, seed=seed):
            est.learn_one(x)


def _outputs(est):
    if isinstance(est, MatrixFactorization):
        return [est.predict_one(f"u{u}", i) for u in range(12) for i in range(9)] + est.rank("u3", range(9))
    if isinstance(est, TopicModel):
        return [est.transform_one({f"w{k}": 1, f"w{k + 8}": 2}) for k in range(8)]
    if isinstance(est, HiddenMarkovModel):
        seqs = [[0, 1, 2, 2], [2, 2, 0], [1]]
        return est.score_many(seqs).tolist() + est.predict_many(seqs)
    return [est.predict_proba_one(x) for x, _ in _stream(30, seed=7)]


@pytest.mark.parametrize("cls,params", _FACES + [
    pytest.param(HiddenMarkovModel, p, id=f"HiddenMarkovModel-{i}")         # no river checks: no base class
    for i, p in enumerate(HiddenMarkovModel._unit_test_params())])
def test_every_face_pickles_and_deepcopies_after_learning(cls, params):
    """A copy (pickle round trip or copy.deepcopy) of a trained face predicts the same and keeps
    learning the same as the original, and is independent of it."""
    est = cls(**params)
    _feed(est, 5 * params["batch_size"] + 3, seed=0)       # a partial batch stays buffered
    for copied in (pickle.loads(pickle.dumps(est)), copy.deepcopy(est)):
        assert type(copied) is cls and copied._state.step == est._state.step
        assert _outputs(copied) == _outputs(est)
        _feed(copied, 2 * params["batch_size"], seed=1)
        twin = copy.deepcopy(est)
        _feed(twin, 2 * params["batch_size"], seed=1)
        assert copied._state.step == twin._state.step > est._state.step
        assert _outputs(copied) == _outputs(twin)


def _daemon_snapshot(tmp_path, batch_size=200, inference=None):
    """A snapshot written by the daemon itself (file source), |S| = 200 > the clusterer's 32."""
    X, _ = make_blobs(1200, seed=5)
    data = tmp_path / "points.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in X.tolist()))
    cfg = validate({
        "model": {"kind": "gmm", "n_components": 3, "n_features": 2, "weight_concentration": 0.5,
                  "mean_precision": 0.2, "scale": 1.0},
        "inference": {"n_total": "auto", "batch_size": batch_size, "tau0": 1.0, "kappa": 0.7,
                      **(inference or {"effective_batch_size": 50})},
        "source": {"kind": "file", "path": str(data), "dead_letter_path": str(tmp_path / "dead.jsonl")},
        "checkpoint": {"directory": str(tmp_path / "ck"), "every_batches": 2},
        "metrics": {"enabled": False, "heldout_size": 0, "progress_seconds": 0.0},
    })
    res = Daemon(cfg, out=io.StringIO()).run(until_drained=True, timeout=120)
    assert res.stopped_by == "drained"
    return tmp_path / "ck", X


def test_from_snapshot_of_a_daemon_with_a_large_batch(tmp_path):
    """Issue 16: the README's call failed on the demo's snapshot (|S| = 200, M = 50):
    'effective_batch_size must be in (0, batch_size=32], got 50.0'."""
    ck, X = _daemon_snapshot(tmp_path)
    est = GaussianMixture.from_snapshot(ck, features=("a", "b"))      # as the README shows it
    fitted = load(ck)
    assert est.batch_size == 200 and est.effective_batch_size == 50
    assert est._state.step == fitted.step == 6
    assert [est.predict_one({"a": a, "b": b}) for a, b in X[:100]] == fitted.predict(X[:100]).tolist()
    est.learn_many(pd.DataFrame(X[:200], columns=["a", "b"]))          # one update of |S| = 200
    assert est._state.step == 7
    small = GaussianMixture.from_snapshot(ck, features=("a", "b"), batch_size=64)
    assert small.batch_size == 64 and small.effective_batch_size == 50
    with pytest.raises(ValueError, match=r"batch_size=32 is smaller than the snapshot's SVI\+ effective "
                                         r"batch size M=50; pass batch_size >= 50 \(the daemon used "
                                         r"batch_size=200\)"):
        GaussianMixture.from_snapshot(ck, features=("a", "b"), batch_size=32)


def test_from_snapshot_keeps_an_effective_fraction(tmp_path):
    ck, _ = _daemon_snapshot(tmp_path, inference={"effective_fraction": 0.25})
    est = GaussianMixture.from_snapshot(ck)
    assert est.batch_size == 200 and est.effective_batch_size == 50 and est.features == ("x0", "x1")
    assert GaussianMixture.from_snapshot(ck, batch_size=40).effective_batch_size == 10


# ------------------------------------------------------------------ annealing
def test_faces_take_an_annealer_or_its_dict():
    """``annealing=`` (dict or Annealer) gives the engine's annealer; the face's updates are
    the engine's own (same seed, same batches, same λ)."""
    from streamsvi.inference.annealing import Deterministic

    X, _ = make_blobs(200, seed=2)
    ests = [GaussianMixture(n_components=3, batch_size=20, n_total=200, seed=5, annealing=a)
            for a in ({"kind": "deterministic", "T0": 4.0, "n_steps": 20}, Deterministic(T0=4.0, n_steps=20))]
    plain = GaussianMixture(n_components=3, batch_size=20, n_total=200, seed=5)
    for est in ests + [plain]:
        est.learn_many(pd.DataFrame(X, columns=["a", "b"]))
    assert ests[0]._engine.annealer == Deterministic(T0=4.0, n_steps=20)
    assert ests[0]._state.lam.array_equal(ests[1]._state.lam)
    assert not ests[0]._state.lam.array_equal(plain._state.lam)    # T > 1 changed the updates


def test_faces_refuse_undefined_annealing():
    from streamsvi.estimators import MatrixFactorization

    with pytest.raises(ValueError, match="annealing kind 'stochastic' is not defined for model 'pmf'"):
        MatrixFactorization(annealing={"kind": "stochastic"})
    with pytest.raises(ValueError, match="not both"):
        GaussianMixture(effective_batch_size=4, annealing={"kind": "svi+", "M0": 4})
    with pytest.raises(ValueError, match="unknown setting"):
        TopicModel(annealing={"kind": "deterministic", "temperature": 5})
    with pytest.raises(ValueError, match="effective_batch_size must be in \\(0, batch_size=32\\]"):
        GaussianMixture(batch_size=32, annealing={"kind": "svi+", "M0": 64})


# ------------------------------------------------------------ LogisticRegression
from streamsvi.estimators import LogisticRegression  # noqa: E402


@pytest.mark.parametrize("params", list(LogisticRegression._unit_test_params()))
def test_logistic_river_check_estimator(params):
    """river's whole check suite for a binary MiniBatchClassifier (its own data sets)."""
    checks.check_estimator(LogisticRegression(**params))


def _phishing_progressive(model):
    from river import datasets, metrics

    acc, loss = metrics.Accuracy(), metrics.LogLoss()
    for x, y in datasets.Phishing():
        p = model.predict_proba_one(x)
        acc.update(y, max(p, key=p.get))
        loss.update(y, p)
        model.learn_one(x, y)
    return acc.get(), loss.get()


def test_logistic_defaults_work_on_a_plain_stream_of_dicts():
    """Defaults, raw features (Phishing, bundled with river), progressive validation: as
    accurate as river's LogisticRegression behind a StandardScaler, better log-loss."""
    from river import linear_model, preprocessing

    ours = _phishing_progressive(LogisticRegression(seed=0))
    river_scaled = _phishing_progressive(preprocessing.StandardScaler() | linear_model.LogisticRegression())
    assert ours[0] > 0.85 and ours[0] >= river_scaled[0] - 0.01
    assert ours[1] < river_scaled[1]


def test_logistic_learn_many_matches_learn_one():
    from river import datasets

    data = list(datasets.Phishing().take(300))
    a, b = LogisticRegression(batch_size=10, seed=3), LogisticRegression(batch_size=10, seed=3)
    for x, y in data:
        a.learn_one(x, y)
    b.learn_many(pd.DataFrame([x for x, _ in data]), pd.Series([y for _, y in data]))
    assert a._state.lam.array_equal(b._state.lam)
    X = pd.DataFrame([x for x, _ in data[:20]])
    many = b.predict_proba_many(X)
    np.testing.assert_allclose(many[True].to_numpy(), [a.predict_proba_one(x)[True] for x, _ in data[:20]])
    with pytest.raises(ValueError, match="binary"):
        a.learn_one(data[0][0], "spam")


# ------------------------------------------------------------ SoftmaxRegression
from streamsvi.estimators import SoftmaxRegression  # noqa: E402


@pytest.mark.parametrize("params", list(SoftmaxRegression._unit_test_params()))
def test_softmax_river_check_estimator(params):
    """river's whole check suite for a multiclass MiniBatchClassifier (its own data sets)."""
    checks.check_estimator(SoftmaxRegression(**params))


def test_softmax_face_learns_classes_as_they_come_and_beats_river():
    """ImageSegments (7 classes, bundled with river), progressive validation, defaults: classes
    appear one by one and grow the model; at least as accurate as river's SoftmaxRegression
    behind a StandardScaler. learn_many = learn_one; a pickled copy predicts the same."""
    from river import datasets, linear_model, metrics, preprocessing

    data = list(datasets.ImageSegments())
    ours, theirs = SoftmaxRegression(seed=0), preprocessing.StandardScaler() | linear_model.SoftmaxRegression()
    acc_o, acc_t = metrics.Accuracy(), metrics.Accuracy()
    for x, y in data:
        acc_o.update(y, ours.predict_one(x))
        acc_t.update(y, theirs.predict_one(x))
        ours.learn_one(x, y)
        theirs.learn_one(x, y)
    assert sorted(ours._classes) == sorted({y for _, y in data}) and ours._engine.model.n_classes == 7
    assert acc_o.get() > 0.8 and acc_o.get() >= acc_t.get() - 0.01, (acc_o.get(), acc_t.get())
    a, b = SoftmaxRegression(batch_size=10, seed=3, optimizer="adam", learning_rate=0.05), \
        SoftmaxRegression(batch_size=10, seed=3, optimizer="adam", learning_rate=0.05)
    for x, y in data[:300]:
        a.learn_one(x, y)
    b.learn_many(pd.DataFrame([x for x, _ in data[:300]]), pd.Series([y for _, y in data[:300]]))
    assert a._state.lam.array_equal(b._state.lam) and np.array_equal(a._state.aux["adam_m"], b._state.aux["adam_m"])
    X = pd.DataFrame([x for x, _ in data[300:320]])
    many = b.predict_proba_many(X)
    one = [a.predict_proba_one(x) for x, _ in data[300:320]]
    np.testing.assert_allclose(many[list(a._classes)].to_numpy(), [[p[c] for c in a._classes] for p in one])
    np.testing.assert_allclose(many.sum(axis=1), 1.0)
    c = pickle.loads(pickle.dumps(a))
    assert [c.predict_proba_one(x) for x, _ in data[300:320]] == one
