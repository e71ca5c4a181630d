"""What the mixture faces share (``_MixtureFace``): the start on the first keys and a refused
DataFrame, the same for every mixture."""
import numpy as np
import pandas as pd
import pytest

from streamsvi.estimators import GaussianMixture, GaussianMixture1D, PoissonMixture


def test_gauss1d_does_not_start_from_a_record_without_keys():
    est = GaussianMixture1D(n_components=2, batch_size=4, seed=0)
    est.learn_one({})
    est.learn_many(pd.DataFrame(index=range(3)))
    assert est._features is None and est._learner is None
    est.learn_one({"b": 1.0, "a": 2.0})
    assert est._features == ["a"]


@pytest.mark.parametrize("cls, good, bad", [
    (GaussianMixture, [{"a": 1.0, "b": 2.0}, {"a": -1.0, "b": 0.5}], {"a": "x", "b": 1.0}),
    (PoissonMixture, [{"a": 1, "b": 2}, {"a": 0, "b": 3}], {"a": -1, "b": 1}),
])
def test_a_refused_dataframe_changes_nothing(cls, good, bad):
    """A DataFrame with a refused value raises ValueError; what was learned before goes on as if
    the DataFrame had never come (same predictions as a face that never saw it)."""
    rng = np.random.default_rng(0)
    rows = [dict(good[k % 2]) for k in range(40)]
    if cls is GaussianMixture:
        rows = [{f: v + float(rng.normal()) for f, v in r.items()} for r in rows]
    a, b = cls(n_components=2, batch_size=8, seed=3), cls(n_components=2, batch_size=8, seed=3)
    for r in rows[:35]:
        a.learn_one(r)
        b.learn_one(r)
    with pytest.raises(ValueError):
        a.learn_many(pd.DataFrame([rows[0], bad]))
    a.learn_many(pd.DataFrame(rows[35:]))
    b.learn_many(pd.DataFrame(rows[35:]))
    assert a.state is not None and a.state.step == b.state.step
    X = pd.DataFrame(rows[:5])
    np.testing.assert_array_equal(a.predict_proba_many(X).to_numpy(), b.predict_proba_many(X).to_numpy())
    np.testing.assert_array_equal(a.score_many(X).to_numpy(), b.score_many(X).to_numpy())
