"""The rows split (streamsvi/inference/split_rows.py): PMF and Poisson factorisation scale out.

The check suite (tests/models/test_checks.py) tests λ after six split updates
for every model. Here: the whole state (λ, per-row clocks, totals, pair log,
running values) bit for bit through the real λ file and checkpoint a worker and
an applier use, and what staleness does to rows: two workers' contributions at
the same old version, with an id new to both.
"""
from dataclasses import replace

import numpy as np
import pytest

from streamsvi.checkpoint import CheckpointStore, load_snapshot
from streamsvi.inference import SVI, RobbinsMonro, split
from streamsvi.models import HPF, PMF, Ratings
from streamsvi.models.hpf import sample_counts
from streamsvi.service.roles.transport import Delta, LambdaFile, init_delta, init_state, publish_lambda


def _cases():
    pmf = PMF(n_factors=2, sigma2=0.25, prior_var=1.0, biases=True, offset="auto", remember_rated=True)
    return {
        "pmf-svi+": (pmf, PMF.synthetic_ratings(n=480), {"effective_batch_size": 30}),
        "pmf-seen-ratings-clock": (PMF(n_factors=3, offset=3.0, row_counts="seen", row_clock="ratings",
                                       sweep="items_first"), PMF.synthetic_ratings(n=480), {}),
        "hpf-svi+": (HPF(n_factors=2, remember_rated=True), sample_counts(), {"effective_batch_size": 30}),
    }


def _wire(c, version, a, b):
    """``c`` through the deltas codec, as a worker sends it and the applier reads it."""
    d = Delta.decode(Delta(worker="w", version=version, ranges=[("t", 0, a, b)], records=c.records,
                           stats=c.arrays, min_weight=c.min_weight, extra=c.meta).encode())
    return split.Contribution(arrays=d.stats, records=d.records, min_weight=d.min_weight, meta=d.extra)


def _assert_same_state(a, b, what):
    assert (a.step, a.records_seen) == (b.step, b.records_seen), what
    assert a.lam.array_equal(b.lam), what
    da, db = dict(a.aux), dict(b.aux)
    assert set(da) == set(db), what
    for k in da:
        if isinstance(da[k], np.ndarray) or isinstance(db[k], np.ndarray):
            assert np.array_equal(np.asarray(da[k]), np.asarray(db[k])), f"{what}: aux {k}"
            assert np.asarray(da[k]).dtype == np.asarray(db[k]).dtype, f"{what}: aux {k} dtype"
        else:
            assert da[k] == db[k], f"{what}: aux {k}"


@pytest.mark.parametrize("case", sorted(_cases()))
def test_worker_at_the_published_lambda_and_applier_through_checkpoints_are_the_update(case, tmp_path):
    """A worker reads λ from the published file (plain arrays), the applier adopts the λ_0 proposal,
    steps its own state, publishes, checkpoints and is resumed from the checkpoint: every state
    is the one-process update's, λ and aux (n_i, t_i, N_i, caches, totals, pair log, running
    mean), bit for bit."""
    model, X, kw = _cases()[case]
    engine = SVI(model, n_total=2 * len(X), schedule=RobbinsMonro(tau0=1.0, kappa=0.7), **kw)
    B = len(X) // 8
    start = engine.init(X[:B], seed=5)
    # the applier adopts the worker's λ_0 proposal (the "init" message): plain arrays, like a file
    _, proposed = init_state(Delta.decode(init_delta("w", engine, start).encode()))
    applier = replace(start, lam=proposed.lam, aux=proposed.aux)
    single = start
    store = CheckpointStore(tmp_path / "ck", keep=2)
    path = tmp_path / "lambda.npz"
    lam_file = LambdaFile(path)
    new_ids = 0                            # ids the worker's λ has no row for: new rows there too
    for i in range(len(X) // B):
        a, b = B * i, B * (i + 1)
        publish_lambda(path, engine, applier)
        assert lam_file.refresh() and lam_file.version == applier.step
        w_engine, w_state = lam_file.engine, lam_file.state            # the worker's view
        draws = split.batch_rng_state(3, "t", 0, a)
        c = _wire(split.contribution(w_engine, w_state, X[a:b], draws), w_state.step, a, b)
        new_ids += sum(len(set(c.meta["ids"][s]) - set(w_state.aux[f"{s}s"])) for s in ("user", "item"))
        if isinstance(model, PMF):         # Λ's statistics travel as their upper triangle, losslessly
            sums = ("sums_w", "sums") if "effective_batch_size" in kw else ("sums_w",)
            assert sorted(c.meta["symmetric"]) == sorted(f"{b}/{k}" for b in ("user", "item") for k in sums)
        applier, done = split.apply(engine, applier, c)
        single, info = engine.update(replace(single, rng_state=draws), X[a:b])
        applier = replace(applier, rng_state=single.rng_state)
        _assert_same_state(applier, single, f"update {i + 1}")
        assert done.elbo == info.elbo and done.rho == info.rho
        if i % 3 == 1:                     # the applier is killed and resumed from its checkpoint
            store.save(engine, applier, [{"source": "d", "partition": 0, "offset": i}])
            snap = load_snapshot(tmp_path / "ck")
            engine = snap.engine
            applier = snap.state
            _assert_same_state(applier, single, f"checkpoint after update {i + 1}")
    assert single.step == 8 and new_ids > 0


def _pmf_engine():
    model = PMF(n_factors=2, sigma2=0.25, prior_var=1.0, biases=True, offset=3.0, remember_rated=True)
    return SVI(model, n_total=1000.0, schedule=RobbinsMonro(tau0=1.0, kappa=0.7))


def _joined(a, b):
    return Ratings(list(a.user) + list(b.user), list(a.item) + list(b.item), np.r_[a.rating, b.rating])


def test_two_stale_contributions_with_an_id_new_to_both_make_one_row():
    """Two workers at the same λ version, each with ratings of user "newbie" and item "fresh" (ids
    no state has): applied one after the other, the row is created once (by the first), its
    clock and count are the applier's (t = 2, n = both batches' ratings), the second step is
    ρ(t = 2)'s at the applier's rows (whose order is not the second worker's), and λ stays
    finite."""
    engine = _pmf_engine()
    X = PMF.synthetic_ratings(n=400)
    state = engine.init(X[:100], seed=1)
    for k in range(1, 4):
        state, _ = engine.update(state, X[100 * (k - 1):100 * k])
    x1 = _joined(X[300:340], Ratings(["newbie"] * 3 + ["u1"], ["fresh", 2, 3, "fresh"],
                                     [4.0, 2.0, 5.0, 3.0]))
    # x2 meets "other" (new to every state) before "fresh": its worker orders them (other, fresh),
    # the applier, which has "fresh" from x1 by then, (fresh, other)
    x2 = _joined(X[340:380], Ratings(["newbie"] * 3, ["other", "fresh", 7], [2.0, 1.0, 4.5]))
    v = state.step
    c1 = _wire(split.contribution(engine, state, x1, split.batch_rng_state(0, "t", 0, 300)), v, 300, 344)
    c2 = _wire(split.contribution(engine, state, x2, split.batch_rng_state(0, "t", 1, 340)), v, 340, 382)
    for c in (c1, c2):
        assert "newbie" in c.meta["ids"]["user"] and "fresh" in c.meta["ids"]["item"]
    assert c2.meta["ids"]["item"].index("other") < c2.meta["ids"]["item"].index("fresh")
    s1, d1 = split.apply(engine, state, c1)
    s2, d2 = split.apply(engine, s1, c2, rho_scale=0.5)     # one version stale: down-weighted
    assert (d1.step, d2.step) == (v + 1, v + 2)
    assert s2.records_seen == state.records_seen + len(x1) + len(x2)
    aux = s2.aux
    assert aux["users"].count("newbie") == 1 and aux["items"].count("fresh") == 1
    assert len(aux["users"]) == len(state.aux["users"]) + 1
    assert len(aux["items"]) == len(state.aux["items"]) + 2
    r, j, o = aux["users"].index("newbie"), aux["items"].index("fresh"), aux["items"].index("other")
    assert r == len(state.aux["users"]) and (j, o) == (len(state.aux["items"]), j + 1)   # each made once
    assert aux["user_n"][r] == 3 + 3 and aux["user_t"][r] == 2
    assert aux["item_n"][j] == 2 + 1 and aux["item_t"][j] == 2
    assert aux["item_n"][o] == 1 and aux["item_t"][o] == 1
    u1 = aux["users"].index("u1")
    assert aux["user_t"][u1] == state.aux["user_t"][u1] + 1 + int("u1" in x2.user)
    # the pair log holds every rating once, at the applier's rows
    rated = aux["rated"]
    assert len(rated) == len(state.aux["rated"]) + len(x1) + len(x2)
    assert np.count_nonzero((rated[:, 0] == r) & (rated[:, 1] == j)) == 2
    assert np.count_nonzero((rated[:, 0] == r) & (rated[:, 1] == o)) == 1
    assert s2.lam.all_finite() and np.isfinite(aux["user_kl"]).all()
    # the first step at the contribution's own version is the one-process update
    one, _ = engine.update(replace(state, rng_state=split.batch_rng_state(0, "t", 0, 300)), x1)
    _assert_same_state(replace(s1, rng_state=one.rng_state), one, "the first contribution")
    # the second is the applier's step from c2's statistics at its own rows (one version old, in
    # its own row order), with ρ_i = schedule(t_i) halved by the staleness scale
    D = engine.model.dim
    for side, key, row, count in (("user", "newbie", r, 3), ("item", "fresh", j, 1), ("item", "other", o, 1)):
        h_new = s2.lam.rows(side, np.array([row]))[0][0]
        sums = c2.arrays[f"{side}/sums_w"][c2.meta["ids"][side].index(key)][:D]   # h part first
        N_new = s2.aux[f"{side}_N"][row]
        t = s2.aux[f"{side}_t"][row]
        if t == 1:                        # new: its initial λ, no rescaling
            h_prev, r_ = engine.model.new_rows(state.aux["seed"], side, [key])[0], 1.0
        else:
            h_prev, r_ = s1.lam.rows(side, np.array([row]))[0][0], N_new / s1.aux[f"{side}_N"][row]
        rho = 0.5 * engine.schedule(int(t))
        expect = (1 - rho) * r_ * h_prev + rho * (N_new / count) * sums
        np.testing.assert_allclose(h_new, expect, rtol=1e-12, atol=1e-12, err_msg=f"{side} {key}")


def test_contributions_that_do_not_fit_are_refused_with_a_reason():
    engine = _pmf_engine()
    X = PMF.synthetic_ratings(n=200)
    state = engine.init(X[:100], seed=1)
    c = split.contribution(engine, state, X[100:150], split.batch_rng_state(0, "t", 0, 100))
    with pytest.raises(ValueError, match="not a row contribution"):
        split.apply(engine, state, split.Contribution(arrays=c.arrays, records=c.records))
    bad = dict(c.meta, ids=dict(c.meta["ids"], user=c.meta["ids"]["user"][:1] * len(c.meta["ids"]["user"])))
    with pytest.raises(ValueError, match="not distinct"):
        split.apply(engine, state, split.Contribution(arrays=c.arrays, records=c.records, meta=bad))
    arrays = {k: v for k, v in c.arrays.items() if k != "item/counts"}
    with pytest.raises(ValueError, match="lacks"):
        split.apply(engine, state, split.Contribution(arrays=arrays, records=c.records, meta=c.meta))
    assert split.storage_kind(engine) == "rows" and split.why_not(engine) is None
