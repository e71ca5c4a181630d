"""Seed 000 §IV-D and §IV-E on the Bayesian GMM: batch VI vs SVI vs SVI+.

(a) §IV-D, objective comparison. GMM with the paper's prior
    (``BayesianGMM.paper_prior(K, D, alpha=0.5, c=10)``), 20 random
    initialisations (seeds 0..19; every method starts from the same λ for a
    given seed). Methods: batch VI (CAVI, full data every step), SVI (M = |S|)
    and SVI+ (M < |S|), on

      * synthetic 2-D, ``make_blobs(250, seed=0)``, K = 4, |S| = 50, M = 10;
      * Pima (768 × 8, standardized), K = 5, |S| = 200, M ∈ {50, 100, 150}.

    Schedule ``RobbinsMonro(tau0=1, kappa=0.7)``; every stochastic run sees the
    records of 100 batch epochs (500 steps on the synthetic set, 384 on Pima),
    batch VI does 100 sweeps. Reported: the full-data ELBO
    ``engine.elbo(state.lam, X)`` (N = len(X)) of each run's *final* λ as it
    is, per method (mean, sd, min, median, max), and how many seeds beat batch
    VI on the same seed (win / tie / loss, tie = within 1 nat). Two extras,
    labelled as such: the ELBO after 100 CAVI sweeps from the final λ (which
    basin the run ended in, free of terminal SGD noise) and a schedule
    sensitivity table (κ = 0.51 and 0.9).

(b) §IV-E, DP approximation.
    ``BayesianGMM.dp_approximation(n_features=2, concentration=1.0,
    n_components=50)`` on ``make_blobs(1000, seed=0)`` (4 true clusters).
    |S| ∈ {10, 20, 30, 40, 50}; SVI and SVI+ with M = f·|S|, f ∈ {0.2, 0.4,
    0.6} (``effective_fraction``); 2000 updates per run with
    ``RobbinsMonro(tau0=1, kappa=0.51)``; batch VI 500 sweeps; 10 inits each.
    Reported: the number of occupied clusters (E_q[π_k]·N ≥ 1 % of N; or ≥ 1
    MAP-assigned record), mean and histogram; the size-sorted average weight
    distribution (like the paper's Fig. 4) and a typical clustering (Fig. 5).

Ends with a verdict on each of the paper's claims.

Run::

    python bench/paper_gmm.py            # full, ~7 min on 2 cores
    python bench/paper_gmm.py --quick    # reduced, < 1 min

Tables go to stdout, progress to stderr, plots to ``bench/out/``. Uses two
worker processes (``--jobs``) with single-threaded BLAS.
"""
from __future__ import annotations

import os

for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import Counter  # noqa: E402
from multiprocessing import get_context  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from _common import fmt_table, load_pima  # noqa: E402  (bench/ sibling)
from streamsvi import SVI, BayesianGMM, RobbinsMonro, batch_vi  # noqa: E402
from streamsvi.datasets import make_blobs, standardize  # noqa: E402

OUT = Path(__file__).resolve().parent / "out"
TIE = 1.0          # nats: |ELBO_a − ELBO_b| ≤ TIE counts as a tie
T0 = time.time()

# data sets, set in main() before the worker pool forks
DATA: dict[str, np.ndarray] = {}


def log(msg):
    print(f"[paper_gmm {time.time() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------- workers
def _engine(model, N, spec):
    if spec["method"] == "batch":
        return batch_vi(model, N)
    sched = RobbinsMonro(tau0=spec["tau0"], kappa=spec["kappa"])
    if spec.get("frac") is not None:
        return SVI(model, N, sched, effective_fraction=spec["frac"])
    return SVI(model, N, sched, effective_batch_size=spec.get("M"))


def _run(spec):
    """One run: fit from seed ``spec['seed']``; return what the tables need."""
    t0 = time.time()
    X = DATA[spec["data"]]
    N, D = X.shape
    if spec["model"] == "paper":
        model = BayesianGMM.paper_prior(spec["K"], D, alpha=0.5, c=10.0)
    else:
        model = BayesianGMM.dp_approximation(n_features=D, concentration=1.0,
                                             n_components=spec["K"])
    eng = _engine(model, N, spec)
    state = eng.init(X, seed=spec["seed"])
    curve = []
    if spec.get("curve"):
        curve.append((0.0, eng.elbo(state.lam, X)))
        last = [0]

        def cb(st, info):
            ep = st.records_seen // N
            if ep > last[0]:
                last[0] = ep
                curve.append((st.records_seen / N, eng.elbo(st.lam, X)))
    else:
        cb = None
    out = {"spec": spec, "error": None, "checks": []}
    batch_size = None if spec["method"] == "batch" else spec["S"]
    stops = sorted(set(spec.get("checkpoints", [])) | {spec["steps"]})
    infos = []
    try:
        for stop in stops:
            state, inf = eng.fit(state, X, stop - state.step, batch_size, callback=cb)
            infos += inf
            if spec["model"] == "dp" and stop != spec["steps"]:
                out["checks"].append((stop, *_occupied(model, state.lam, X), eng.elbo(state.lam, X)))
    except (FloatingPointError, np.linalg.LinAlgError, ValueError) as exc:
        out["error"] = f"{type(exc).__name__} at step {state.step}: {exc}"
        out["time"] = time.time() - t0
        return out
    lam = state.lam
    out["elbo"] = eng.elbo(lam, X)
    out["curve"] = curve
    out["clipped_steps"] = sum(1 for i in infos if i.domain_clipped)
    out["min_weight"] = min(i.min_weight for i in infos)
    if spec.get("polish"):
        pe = batch_vi(model, N)
        ps, _ = pe.fit(pe.state_from_params(lam), X, spec["polish"])
        out["polished"] = pe.elbo(ps.lam, X)
    if spec["model"] == "dp":
        w = model.weights(lam)
        z = model.predict(lam, X)
        sizes = np.bincount(z, minlength=spec["K"]) / N
        out["weights_sorted"] = np.sort(w)[::-1]
        out["map_sorted"] = np.sort(sizes)[::-1]
        out["occ_weight"], out["occ_map"] = _occupied(model, lam, X)
        out["checks"].append((spec["steps"], out["occ_weight"], out["occ_map"], out["elbo"]))
        if spec.get("keep_labels"):
            out["labels"] = z
    out["time"] = time.time() - t0
    return out


def _occupied(model, lam, X):
    """(clusters with E_q[π_k]·N ≥ 1 % of N, clusters with ≥ 1 MAP-assigned record)."""
    N = len(X)
    w = model.weights(lam)
    z = model.predict(lam, X)
    return int(np.count_nonzero(w * N >= 0.01 * N)), int(np.unique(z).size)


def run_all(specs, jobs, what):
    """Run specs in a pool (longest first), with progress on stderr."""
    order = sorted(range(len(specs)), key=lambda i: -specs[i]["steps"] * (specs[i].get("S") or 50))
    results = [None] * len(specs)
    t0 = time.time()
    tagged = [(i, specs[i]) for i in order]
    last = t0
    if jobs > 1:
        ctx = get_context("fork")
        with ctx.Pool(jobs) as pool:
            it = pool.imap_unordered(_run_tagged, tagged, chunksize=1)
            for n, (i, res) in enumerate(it, 1):
                results[i] = res
                last = _progress(what, n, len(specs), t0, last)
    else:
        for n, (i, s) in enumerate(tagged, 1):
            results[i] = _run(s)
            last = _progress(what, n, len(specs), t0, last)
    return results


def _progress(what, n, total, t0, last):
    """Log progress at most every 5 s (and at the end); returns the time of the last log."""
    now = time.time()
    if n == total or now - last >= 5.0:
        eta = (now - t0) / n * (total - n)
        log(f"{what}: {n}/{total} runs ({now - t0:.0f} s, ~{eta:.0f} s left)")
        return now
    return last


def _run_tagged(item):
    i, spec = item
    return i, _run(spec)


# ------------------------------------------------------------------ tables
def wtl(a, b, tol=TIE):
    """Wins / ties / losses of a over b, seed by seed."""
    d = np.asarray(a) - np.asarray(b)
    return int((d > tol).sum()), int((np.abs(d) <= tol).sum()), int((d < -tol).sum())


def hist_str(counts):
    c = Counter(int(v) for v in counts)
    return " ".join(f"{k}:{c[k]}" for k in sorted(c))


# ------------------------------------------------------------ part (a)
def part_a(args):
    n_seeds = 5 if args.quick else 20
    epochs = 40 if args.quick else 100
    kappa, tau0 = 0.7, 1.0
    sets = {
        "synthetic": dict(K=4, S=50, Ms=[10]),
        "pima": dict(K=5, S=200, Ms=[50, 100, 150]),
    }
    print("=" * 78)
    print("(a) Seed 000 §IV-D: final full-data ELBO, batch VI vs SVI vs SVI+")
    print("=" * 78)
    print(f"prior: paper_prior(K, D, alpha=0.5, c=10) (a = D, B = I, beta0 = 1/c); "
          f"{n_seeds} inits (seeds 0..{n_seeds - 1}),")
    print(f"init: the model default ('random_from_data'); schedule RobbinsMonro(tau0={tau0:g}, "
          f"kappa={kappa}); budget = {epochs} epochs")
    print(f"(batch VI: {epochs} CAVI sweeps; SVI/SVI+: {epochs}·N/|S| steps). 'vs batch' = "
          f"wins/ties/losses against batch VI\nfrom the same seed (tie: within {TIE:g} nat). "
          "'polished' (diagnostic only, not the paper's metric) =\nELBO after 100 CAVI sweeps "
          "from the run's final λ, i.e. which local optimum the run was in.\n")

    specs = []
    for name, cfg in sets.items():
        N = len(DATA[name])
        steps = int(round(epochs * N / cfg["S"]))
        cfg["steps"] = steps
        methods = [("batch VI", dict(method="batch", steps=epochs)),
                   (f"SVI |S|={cfg['S']}", dict(method="svi", S=cfg["S"], M=None, steps=steps))]
        methods += [(f"SVI+ |S|={cfg['S']} M={M}", dict(method="svi+", S=cfg["S"], M=M, steps=steps))
                    for M in cfg["Ms"]]
        cfg["methods"] = [m for m, _ in methods]
        for label, m in methods:
            for seed in range(n_seeds):
                specs.append(dict(m, data=name, model="paper", K=cfg["K"], seed=seed, label=label,
                                  kappa=kappa, tau0=tau0, curve=True, polish=100, part="a"))
    # schedule sensitivity (stochastic methods only; batch VI has no schedule)
    sens = [] if args.quick else [(0.51, 1.0), (0.9, 1.0)]
    for kap, tau in sens:
        for name, cfg in sets.items():
            for label in cfg["methods"][1:]:
                M = None if label.startswith("SVI |") else int(label.split("M=")[1])
                for seed in range(n_seeds):
                    specs.append(dict(method="svi" if M is None else "svi+", S=cfg["S"], M=M,
                                      steps=cfg["steps"], data=name, model="paper", K=cfg["K"],
                                      seed=seed, label=label, kappa=kap, tau0=tau, part="sens"))
    results = run_all(specs, args.jobs, "(a)")

    verdict = {}
    for name, cfg in sets.items():
        N, D = DATA[name].shape
        print(f"--- {name}: N={N}, D={D}, K={cfg['K']}, |S|={cfg['S']}, "
              f"{cfg['steps']} stochastic steps ---")
        R = {lab: sorted([r for r in results if r["spec"]["part"] == "a" and r["spec"]["data"] == name
                          and r["spec"]["label"] == lab], key=lambda r: r["spec"]["seed"])
             for lab in cfg["methods"]}
        errs = {lab: [r for r in rs if r["error"]] for lab, rs in R.items()}
        for lab, e in errs.items():
            for r in e:
                print(f"  !! {lab} seed {r['spec']['seed']} failed: {r['error']}")
        ok = {lab: [r for r in rs if not r["error"]] for lab, rs in R.items()}
        final = {lab: np.array([r["elbo"] for r in rs]) for lab, rs in ok.items()}
        pol = {lab: np.array([r["polished"] for r in rs]) for lab, rs in ok.items()}
        base = final["batch VI"]
        rows = []
        for lab in cfg["methods"]:
            v = final[lab]
            w = wtl(v, base) if lab != "batch VI" and len(v) == len(base) else ("-", "-", "-")
            pw = wtl(pol[lab], pol["batch VI"]) if lab != "batch VI" else ("-", "-", "-")
            clipped = sum(r["clipped_steps"] for r in ok[lab])
            rows.append([lab, len(v), f"{v.mean():.2f}", f"{v.std(ddof=1):.2f}", f"{v.min():.2f}",
                         f"{np.median(v):.2f}", f"{v.max():.2f}", "/".join(map(str, w)),
                         f"{pol[lab].mean():.2f}", "/".join(map(str, pw)), clipped])
        print(fmt_table(["method", "runs", "mean", "sd", "min", "median", "max", "vs batch W/T/L",
                         "polished mean", "polished vs batch", "clipped steps"], rows))
        # SVI+ against SVI, seed by seed
        svi_lab = cfg["methods"][1]
        rows = []
        for lab in cfg["methods"][2:]:
            rows.append([lab, "/".join(map(str, wtl(final[lab], final[svi_lab]))),
                         "/".join(map(str, wtl(pol[lab], pol[svi_lab])))])
        print()
        print(fmt_table([f"vs {svi_lab}, same seed", "final W/T/L", "polished W/T/L"], rows))
        print()
        verdict[name] = dict(final=final, pol=pol, methods=cfg["methods"])
        plot_curves(name, cfg, ok)
    plot_boxes(sets, verdict)

    if sens:
        print(f"--- schedule sensitivity (extra): mean final ELBO, and W/T/L vs batch VI "
              f"(same seed, tie {TIE:g} nat) ---")
        rows = []
        for name, cfg in sets.items():
            base = verdict[name]["final"]["batch VI"]
            for lab in cfg["methods"][1:]:
                row = [name, lab]
                for kap, tau in [(kappa, tau0)] + sens:
                    if (kap, tau) == (kappa, tau0):
                        v = verdict[name]["final"][lab]
                    else:
                        rs = sorted([r for r in results if r["spec"]["part"] == "sens"
                                     and r["spec"]["data"] == name and r["spec"]["label"] == lab
                                     and r["spec"]["kappa"] == kap and not r["error"]],
                                    key=lambda r: r["spec"]["seed"])
                        v = np.array([r["elbo"] for r in rs])
                    w = wtl(v, base) if len(v) == len(base) else ("?",) * 3
                    row += [f"{v.mean():.1f}", "/".join(map(str, w))]
                rows.append(row)
            rows.append([name, "batch VI", f"{base.mean():.1f}", "", "", "", "", ""])
        hdr = ["data", "method"]
        for kap, tau in [(kappa, tau0)] + sens:
            hdr += [f"k={kap:g},t0={tau:g}", "W/T/L"]
        print(fmt_table(hdr, rows))
        print()
    return verdict


def plot_curves(name, cfg, ok):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    lo_all, hi = [], -np.inf
    for c, lab in zip(colors, cfg["methods"]):
        runs = ok[lab]
        if not runs:
            continue
        # align on the epoch grid of the first run (all runs of a method share it)
        ep = np.array([e for e, _ in runs[0]["curve"]])
        Y = np.array([[v for _, v in r["curve"]] for r in runs])
        med = np.median(Y, axis=0)
        q1, q3 = np.percentile(Y, [25, 75], axis=0)
        axes[0].plot(ep, med, color=c, label=lab)
        axes[0].fill_between(ep, q1, q3, color=c, alpha=0.2)
        r0 = next((r for r in runs if r["spec"]["seed"] == 0), runs[0])
        axes[1].plot(ep, [v for _, v in r0["curve"]], color=c, label=lab)
        lo_all.append(np.percentile(Y[:, ep >= 3], 10) if np.any(ep >= 3) else Y.min())
        hi = max(hi, Y.max())
    lo = min(lo_all)
    for ax in axes:
        ax.set_xlabel("epochs (records seen / N)")
        ax.set_ylabel("full-data ELBO")
        ax.set_ylim(lo, hi + 0.05 * (hi - lo))
        ax.grid(alpha=0.3)
    axes[0].set_title(f"{name}: median and IQR over inits")
    axes[1].set_title(f"{name}: seed 0")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / f"paper_gmm_a_{name}_curves.png", dpi=110)
    plt.close(fig)


def plot_boxes(sets, verdict):
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(sets), figsize=(6 * len(sets), 4.5))
    for ax, name in zip(np.atleast_1d(axes), sets):
        labs = verdict[name]["methods"]
        data = [verdict[name]["final"][lab] for lab in labs]
        ax.boxplot(data, showmeans=True, showfliers=False)   # every point is drawn below
        ax.set_xticks(range(1, len(labs) + 1), labs)
        rng = np.random.default_rng(0)
        for i, lab in enumerate(labs, 1):
            v = verdict[name]["final"][lab]
            ax.plot(i + rng.uniform(-0.12, 0.12, len(v)), v, ".", color="k", alpha=0.4)
            p = verdict[name]["pol"][lab]
            ax.plot(np.full(len(p), i + 0.3), p, "_", color="tab:red", alpha=0.6,
                    label="after 100 CAVI sweeps" if i == 1 else None)
        ax.set_title(f"{name}: final full-data ELBO per init")
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(OUT / "paper_gmm_a_boxplot.png", dpi=110)
    plt.close(fig)


# ------------------------------------------------------------ part (b)
def part_b(args):
    n_seeds = 3 if args.quick else 10
    steps = 500 if args.quick else 2000
    batch_checks = [20, 100] if args.quick else [20, 100, 200]
    batch_sweeps = 200 if args.quick else 500
    sizes = [20, 50] if args.quick else [10, 20, 30, 40, 50]
    fracs = [0.2, 0.6] if args.quick else [0.2, 0.4, 0.6]
    long_S, long_steps = 50, [2000, 4000, 6000]      # convergence check (full run only)
    kappa, tau0, K = 0.51, 1.0, 50
    typ_S = 50 if args.quick else 40
    typ_f = 0.2 if args.quick else 0.4
    X = DATA["dp"]
    N = len(X)
    print("=" * 78)
    print("(b) Seed 000 §IV-E: number of clusters with a truncated DP mixture (K = 50)")
    print("=" * 78)
    print(f"data: make_blobs({N}, seed=0), 4 true clusters of sizes "
          f"{np.bincount(DATA['dp_labels']).tolist()}; dp_approximation(n_features=2, "
          f"concentration=1.0, n_components={K})")
    print(f"init: model default ('random_from_data'); {n_seeds} inits per setting; SVI/SVI+: {steps} "
          f"updates, RobbinsMonro(tau0={tau0:g}, kappa={kappa});\nbatch VI: {batch_sweeps} sweeps "
          f"(also read at {', '.join(map(str, batch_checks))} sweeps). {steps} updates of |S| records "
          f"= {steps * min(sizes) // N}..{steps * max(sizes) // N} epochs.")
    print("occupied (w): E_q[pi_k]·N >= 1% of N;  occupied (MAP): >= 1 record MAP-assigned to k;  "
          "hist = count:runs\n")
    specs = []
    for seed in range(n_seeds):
        specs.append(dict(method="batch", steps=batch_sweeps, checkpoints=batch_checks, data="dp",
                          model="dp", K=K, seed=seed, label="batch VI", group="batch",
                          keep_labels=seed == 0, part="b"))
    for S in sizes:
        for f in [None] + fracs:
            lab = f"SVI |S|={S}" if f is None else f"SVI+ |S|={S} M={f:g}|S|"
            for seed in range(n_seeds):
                specs.append(dict(method="svi" if f is None else "svi+", S=S, frac=f, steps=steps,
                                  data="dp", model="dp", K=K, seed=seed, label=lab,
                                  group="SVI" if f is None else "SVI+", kappa=kappa, tau0=tau0,
                                  keep_labels=(seed == 0 and S == typ_S and f in (None, typ_f)),
                                  part="b"))
    if not args.quick:
        for f in (None, 0.2):
            lab = f"SVI |S|={long_S}" if f is None else f"SVI+ |S|={long_S} M={f:g}|S|"
            for seed in range(n_seeds):
                specs.append(dict(method="svi" if f is None else "svi+", S=long_S, frac=f,
                                  steps=long_steps[-1], checkpoints=long_steps[:-1], data="dp",
                                  model="dp", K=K, seed=seed, label=lab, group="long", kappa=kappa,
                                  tau0=tau0, part="b"))
    results = run_all(specs, args.jobs, "(b)")
    bad = [r for r in results if r["error"]]
    for r in bad:
        print(f"  !! {r['spec']['label']} seed {r['spec']['seed']} failed: {r['error']}")
    ok = [r for r in results if not r["error"]]

    def row(lab, rs, at=None):
        """Table row; ``at``: read the run at that checkpoint instead of its end."""
        if at is not None:
            cs = [next(c for c in r["checks"] if c[0] == at) for r in rs]
            ow, om, el = [c[1] for c in cs], [c[2] for c in cs], [c[3] for c in cs]
        else:
            ow = [r["occ_weight"] for r in rs]
            om = [r["occ_map"] for r in rs]
            el = [r["elbo"] for r in rs]
        return [lab, len(rs), f"{np.mean(ow):.2f}", hist_str(ow), f"{np.mean(om):.2f}", hist_str(om),
                f"{np.mean(np.array(ow) == 4):.2f}", f"{np.mean(np.array(om) == 4):.2f}",
                f"{np.mean(el):.1f}"]

    hdr = ["method", "runs", "occ(w)", "hist (w)", "occ(MAP)", "hist (MAP)", "P(w=4)", "P(MAP=4)",
           "ELBO"]
    batch = [r for r in ok if r["spec"]["group"] == "batch"]
    rows = [row(f"batch VI, {c} sweeps", batch, at=c) for c in batch_checks]
    rows.append(row(f"batch VI, {batch_sweeps} sweeps", batch))
    labels = list(dict.fromkeys(s["label"] for s in specs if s["group"] in ("SVI", "SVI+")))
    rows += [row(lab, [r for r in ok if r["spec"]["label"] == lab and r["spec"]["group"] != "long"])
             for lab in labels]
    print(fmt_table(hdr, rows))
    print()
    groups = {"batch VI": batch,
              "SVI (all |S|)": [r for r in ok if r["spec"]["group"] == "SVI"],
              "SVI+ (all |S|, all M)": [r for r in ok if r["spec"]["group"] == "SVI+"]}
    for f in fracs:
        groups[f"SVI+ M={f:g}|S| (all |S|)"] = [r for r in ok if r["spec"]["group"] == "SVI+"
                                               and r["spec"]["frac"] == f]
    print(f"pooled (batch VI at {batch_sweeps} sweeps):")
    print(fmt_table(hdr, [row(g, rs) for g, rs in groups.items()]))
    clipped = [r["clipped_steps"] for r in groups["SVI+ (all |S|, all M)"]]
    print(f"\nSVI+ runs: steps with a domain-clipped block: mean {np.mean(clipped):.0f} of {steps}; "
          f"failed runs: {len(bad)}")
    long = [r for r in ok if r["spec"]["group"] == "long"]
    if long:
        print(f"\nconvergence check (extra): |S|={long_S}, the same seeds run on to {long_steps[-1]} "
              "updates, read at each checkpoint:")
        rows = []
        for lab in dict.fromkeys(r["spec"]["label"] for r in long):
            rs = [r for r in long if r["spec"]["label"] == lab]
            rows += [row(f"{lab} @ {c}", rs, at=c) for c in long_steps]
        print(fmt_table(hdr, rows))
        groups["_long"] = long
        groups["_long_steps"] = long_steps
    groups["_batch_checks"] = {c: [next(x for x in r["checks"] if x[0] == c) for r in batch]
                               for c in batch_checks}
    print()
    plot_dp(groups, ok, typ_S, typ_f)
    return groups


def plot_dp(groups, ok, typ_S, typ_f):
    import matplotlib.pyplot as plt
    show = 12
    main = ["batch VI", "SVI (all |S|)", "SVI+ (all |S|, all M)"]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    truth = np.sort(np.bincount(DATA["dp_labels"]) / len(DATA["dp_labels"]))[::-1]
    for ax, g in zip(axes, main):
        rs = groups[g]
        W = np.mean([r["weights_sorted"] for r in rs], axis=0)
        Z = np.mean([r["map_sorted"] for r in rs], axis=0)
        ax.bar(np.arange(1, show + 1), W[:show], color="tab:blue", alpha=0.7, label="E_q[π] (sorted)")
        ax.plot(np.arange(1, show + 1), Z[:show], "o", color="tab:orange", label="MAP share (sorted)")
        ax.plot(np.arange(1, len(truth) + 1), truth, "k_", markersize=18, mew=2, label="truth")
        ax.set_title(f"{g}: {len(rs)} runs")
        ax.set_xlabel(f"cluster rank (first {show} of 50)")
        ax.grid(alpha=0.3, axis="y")
    axes[0].set_ylabel("average fraction of data")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "paper_gmm_b_weights.png", dpi=110)
    plt.close(fig)

    # histogram of the occupied count per method group
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    for ax, key, title in [(axes[0], "occ_weight", "occupied: E[π]·N ≥ 1% N"),
                           (axes[1], "occ_map", "occupied: ≥ 1 MAP record")]:
        allv = [r[key] for g in main for r in groups[g]]
        bins = np.arange(min(allv), max(allv) + 2) - 0.5
        for i, g in enumerate(main):
            v = [r[key] for r in groups[g]]
            c, _ = np.histogram(v, bins=bins)
            ax.bar(bins[:-1] + 0.5 + (i - 1) * 0.27, c / len(v), width=0.27, label=g)
        ax.axvline(4, color="k", ls="--", lw=1)
        ax.set_xlabel("number of occupied clusters")
        ax.set_ylabel("fraction of runs")
        ax.set_title(title)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(OUT / "paper_gmm_b_counts.png", dpi=110)
    plt.close(fig)

    # a typical clustering (paper Fig. 5): seed 0
    typ = [("batch VI", lambda s: s["group"] == "batch"),
           (f"SVI |S|={typ_S}", lambda s: s["group"] == "SVI" and s["S"] == typ_S),
           (f"SVI+ |S|={typ_S} M={typ_f:g}|S|",
            lambda s: s["group"] == "SVI+" and s["S"] == typ_S and s["frac"] == typ_f)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharex=True, sharey=True)
    X = DATA["dp"]
    for ax, (title, pick) in zip(axes, typ):
        r = next((r for r in ok if pick(r["spec"]) and r["spec"]["seed"] == 0 and "labels" in r), None)
        if r is None:
            continue
        z = r["labels"]
        ranks = {k: i for i, (k, _) in enumerate(Counter(z.tolist()).most_common())}
        ax.scatter(X[:, 0], X[:, 1], c=[ranks[k] for k in z], cmap="tab10", s=6, vmin=0, vmax=9)
        ax.set_title(f"{title}, seed 0: {len(ranks)} clusters")
    fig.tight_layout()
    fig.savefig(OUT / "paper_gmm_b_typical.png", dpi=110)
    plt.close(fig)


# ----------------------------------------------------------------- verdict
def print_verdict(va, vb):
    print("=" * 78)
    print("VERDICT")
    print("=" * 78)
    for name, v in va.items():
        f, p, labs = v["final"], v["pol"], v["methods"]
        b, s = labs[0], labs[1]
        plus = labs[2:]
        best = max(plus, key=lambda lab: f[lab].mean())
        beats_svi = f[best].mean() > f[s].mean()
        beats_b = f[best].mean() > f[b].mean()
        w_s, w_b = wtl(f[best], f[s]), wtl(f[best], f[b])
        print(f"* §IV-D {name}: 'SVI+ reaches a better final ELBO than SVI and batch VI' -> "
              f"{'SUPPORTED' if beats_svi and beats_b else 'NOT SUPPORTED'} on these data.")
        print(f"    best SVI+ ({best}) mean {f[best].mean():.1f} vs SVI {f[s].mean():.1f} vs batch "
              f"{f[b].mean():.1f}; per seed W/T/L vs SVI {'/'.join(map(str, w_s))}, "
              f"vs batch {'/'.join(map(str, w_b))}.")
        for lab in plus:
            print(f"    {lab}: mean final {f[lab].mean():.1f}; polished {p[lab].mean():.1f} "
                  f"(SVI polished {p[s].mean():.1f}, batch {p[b].mean():.1f}; polished W/T/L vs batch "
                  f"{'/'.join(map(str, wtl(p[lab], p[b])))})")
    if not vb:
        return
    idx = {"occ_weight": 1, "occ_map": 2}
    svi, plus = "SVI (all |S|)", "SVI+ (all |S|, all M)"
    for key, what in [("occ_weight", "E[π]·N ≥ 1% N"), ("occ_map", "≥ 1 MAP record")]:
        m = {g: np.mean([r[key] for r in vb[g]]) for g in ("batch VI", svi, plus)}
        p4 = {g: np.mean([r[key] == 4 for r in vb[g]]) for g in m}
        bchk = {c: np.mean([x[idx[key]] for x in v]) for c, v in vb["_batch_checks"].items()}
        d = {g: abs(v - 4) for g, v in m.items()}
        print(f"* §IV-E, occupied = {what}:")
        print(f"    batch VI over-estimates: {'YES' if m['batch VI'] > 4 else 'NO'} after "
              f"{vb['batch VI'][0]['spec']['steps']} sweeps (mean {m['batch VI']:.2f}); "
              f"earlier: " + ", ".join(f"{c} sweeps {v:.2f}" for c, v in bchk.items()))
        print(f"    SVI under-estimates: {'YES' if m[svi] < 4 else 'NO'} (mean {m[svi]:.2f}; "
              f"{'over' if m[svi] > 4 else 'under'}-estimates)")
        print(f"    SVI+ closer to 4 than SVI: {'YES' if d[plus] < d[svi] else 'NO'}; than batch VI: "
              f"{'YES' if d[plus] < d['batch VI'] else 'NO'} (SVI+ mean {m[plus]:.2f})")
        print("    fraction of runs with exactly 4: " + ", ".join(f"{g} {v:.2f}" for g, v in p4.items()))
    if "_long" in vb:
        steps = vb["_long_steps"]
        parts = []
        for lab in dict.fromkeys(r["spec"]["label"] for r in vb["_long"]):
            rs = [r for r in vb["_long"] if r["spec"]["label"] == lab]
            means = [np.mean([next(c for c in r["checks"] if c[0] == t)[2] for r in rs]) for t in steps]
            parts.append(f"{lab}: " + " -> ".join(f"{v:.1f}" for v in means))
        print(f"* stochastic runs are not converged at {steps[0]} updates: mean occupied (MAP) at "
              f"{'/'.join(map(str, steps))} updates: " + "; ".join(parts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="reduced run (< 1 min)")
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                    help="worker processes (default: min(2, cores))")
    ap.add_argument("--part", choices=["a", "b", "both"], default="both")
    args = ap.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    import matplotlib
    matplotlib.use("Agg")

    DATA["synthetic"] = make_blobs(250, seed=0)[0]
    DATA["pima"] = standardize(load_pima()[0])
    DATA["dp"], DATA["dp_labels"] = make_blobs(1000, seed=0)
    print(f"paper_gmm {'--quick ' if args.quick else ''}(jobs={args.jobs}, numpy {np.__version__})\n")
    va = part_a(args) if args.part in ("a", "both") else {}
    vb = part_b(args) if args.part in ("b", "both") else {}
    if va or vb:
        print_verdict(va, vb)
    print(f"\nplots in {OUT}; total time {time.time() - T0:.0f} s")


if __name__ == "__main__":
    main()
