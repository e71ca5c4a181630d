"""Update throughput (records/s) of streamsvi against a bare numpy E-step.

Setting: Bayesian GMM with D = 8, K = 10 (``BayesianGMM.paper_prior``), batches
of |S| = 1000 records drawn from a synthetic 10-cluster Gaussian mixture
(fixed seed), N = 20 000. Timed, in the same process and interleaved:

* ``streamsvi SVI``   — ``SVI.update(state, batch)`` with M = |S| (plain SVI);
* ``streamsvi SVI+``  — the same with M = 500 (noise weights, weighted and
  unweighted statistics, and the domain check on most steps);
* ``bare numpy``      — the work an update cannot avoid, written as a good
  plain numpy E-step for *fixed* means m_k, precisions P_k and log weights:
  Z = [x_i x_j (i ≤ j) | x | 1] per record, log-responsibilities as ONE
  product with a precomputed (T + D + 1) × K coefficient matrix G, a
  softmax, and the sufficient statistics as ONE product Rᵀ Z. Two layouts:
  ``feature-major`` keeps Z as (T + D + 1, n) and the responsibilities as
  (K, n), the same kernels the model uses (the baseline of the target);
  ``record-major`` keeps Z as (n, T + D + 1) and R as (n, K), the baseline
  of earlier runs (slower: index temporaries for Z, reductions along a
  short axis);
* ``einsum reference`` — the straightforward version: (x − m_k)ᵀ P_k (x − m_k)
  by einsum, softmax, N_k, Rᵀx and Σ_n r_nk x_n x_nᵀ by einsum.

The bare E-steps are checked to give the model's responsibilities and
statistics (to 1e-9) before anything is timed. The streamsvi updates take a
ready batch (no sampling), as the daemon does; every call sees the next of
20 batches, so the per-λ work runs on every update. The bare E-steps are
rebuilt before every round at the λ the SVI engine has reached by then, so
both see the same responsibilities.

Protocol (the machine may be shared and noisy): ``--repeats`` rounds; in each
round the methods take turns in chunks of about ``--chunk`` seconds (0.1)
until each has run for ``--min-time`` seconds, so every method sees the same
machine load (0.01 s chunks gave the same ratios within the noise). A
method's rate in a round is records / its own time. The ratio streamsvi /
bare is taken per round (both measured in the same round), and the target
(0.65) is judged on the median ratio over the rounds; its quartiles, range
and the number of rounds below the target are printed too. A per-call
breakdown of one streamsvi update follows.

BLAS threads: every setting runs in its own child process with
OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS set before numpy is
imported; default 1 (multi-threaded BLAS is slower for these small matrices).

Run::

    python bench/throughput.py                # 1 BLAS thread, 15 rounds, ~45 s
    python bench/throughput.py --threads 1,2  # both settings, side by side
    python bench/throughput.py --quick        # 5 rounds of 0.15 s, < 20 s
    python bench/throughput.py --compare /path/to/old/checkout/streamsvi   # before/after
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import blas_build, cpu_model, fmt_table, rate  # noqa: E402  (bench/ sibling)

OUT = Path(__file__).resolve().parent / "out"
TARGET = 0.65
BARE = "bare numpy (feature-major)"
BARE_RM = "bare numpy (record-major)"
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def log(msg):
    print(f"[throughput] {msg}", file=sys.stderr, flush=True)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="short timings (< 1 min)")
    ap.add_argument("--threads", default="1",
                    help="comma-separated BLAS thread counts, one child process each (default 1)")
    ap.add_argument("--batch", type=int, default=1000, help="|S| (default 1000)")
    ap.add_argument("--M", type=float, default=500, help="SVI+ effective batch size (default 500)")
    ap.add_argument("--D", type=int, default=8)
    ap.add_argument("--K", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=None,
                    help="interleaved rounds (default 15, --quick 5)")
    ap.add_argument("--min-time", type=float, default=None,
                    help="seconds per method per round (default 0.5, --quick 0.15)")
    ap.add_argument("--chunk", type=float, default=0.1,
                    help="seconds a method runs before the next takes its turn (default 0.1)")
    ap.add_argument("--compare", default=None, metavar="DIR",
                    help="also time the streamsvi package in DIR (e.g. an older checkout's "
                         "streamsvi/ directory) in the same rounds, as 'baseline SVI' rows")
    ap.add_argument("--_worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 5 if args.quick else 15
    if args.min_time is None:
        args.min_time = 0.15 if args.quick else 0.5
    try:
        args.thread_list = [int(t) for t in str(args.threads).split(",") if t.strip()]
    except ValueError:
        ap.error(f"--threads must be comma-separated integers, got {args.threads!r}")
    if not args.thread_list or min(args.thread_list) < 1:
        ap.error(f"--threads must be integers >= 1, got {args.threads!r}")
    return args


# =================================================================== parent
def parent(args):
    results = []
    for n in args.thread_list:
        env = dict(os.environ)
        for v in THREAD_VARS:
            env[v] = str(n)
        with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
            res_path = f.name
        cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--_worker", str(n),
               "--_result", res_path]
        log(f"child process with {n} BLAS thread(s) ...")
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            print(f"!! child with {n} thread(s) failed (exit code {rc})")
            continue
        with open(res_path) as f:
            results.append(json.load(f))
        os.unlink(res_path)
    if not results:
        return 1
    if len(results) > 1:
        print("=" * 78)
        print("summary: records/s by BLAS threads (median over rounds); ratios: median of per-round ratios")
        names = list(results[0]["rates"])
        hdr = ["method"] + [f"{r['threads']} thread(s)" for r in results]
        rows = [[m] + [f"{r['rates'][m]:,.0f}" for r in results] for m in names]
        rows.append(["ratio SVI / bare"] + [f"{r['ratio_svi']:.3f}" for r in results])
        rows.append(["ratio SVI+ / bare"] + [f"{r['ratio_svip']:.3f}" for r in results])
        rows.append(["ratio SVI / bare (record-major)"] + [f"{r['ratio_svi_rm']:.3f}" for r in results])
        print(fmt_table(hdr, rows))
    plot(results)
    return 0


def plot(results):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    OUT.mkdir(parents=True, exist_ok=True)
    names = list(results[0]["rates"])
    fig, ax = plt.subplots(figsize=(9, 4))
    w = 0.8 / len(results)
    for i, r in enumerate(results):
        vals = [r["rates"][m] for m in names]
        ax.bar(np.arange(len(names)) + (i - (len(results) - 1) / 2) * w, vals, width=w,
               label=f"{r['threads']} BLAS thread(s), median over rounds")
    bare = results[0]["rates"][BARE]
    ax.axhline(TARGET * bare, color="k", ls="--", lw=1,
               label=f"target {TARGET} × bare ({results[0]['threads']} thread(s))")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("records / s")
    ax.set_title(f"update throughput, D={results[0]['D']}, K={results[0]['K']}, "
                 f"|S|={results[0]['batch']}")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(OUT / "throughput.png", dpi=110)
    plt.close(fig)
    print(f"\nplot: {OUT / 'throughput.png'}")


# =================================================================== worker
def machine_info():
    import numpy as np
    cpu, blas_s = cpu_model(), blas_build()
    try:
        from threadpoolctl import threadpool_info
        pools = ", ".join(f"{p['internal_api']} {p['num_threads']} thread(s)"
                          for p in threadpool_info() if p.get("user_api") == "blas")
    except ImportError:
        pools = "threadpoolctl not installed"
    aff = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cpus": os.cpu_count(), "affinity": aff, "python": platform.python_version(),
            "numpy": np.__version__, "blas": blas_s, "blas_runtime": pools,
            "env": {v: os.environ.get(v) for v in THREAD_VARS}}


def cpu_times():
    """(busy+idle, steal) jiffies from /proc/stat, or None."""
    try:
        with open("/proc/stat") as f:
            v = [int(t) for t in f.readline().split()[1:]]
        return sum(v[:8]), v[7]
    except (OSError, ValueError, IndexError):
        return None


def make_data(D, K, n, seed=0):
    import numpy as np
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 3.0, (K, D))
    A = 0.4 * rng.normal(size=(K, D, D)) + np.eye(D)
    covs = 0.5 * A @ np.swapaxes(A, 1, 2)
    weights = rng.dirichlet(np.full(K, 5.0))
    z = rng.choice(K, size=n, p=weights)
    X = centers[z] + np.einsum("nij,nj->ni", np.linalg.cholesky(covs)[z], rng.normal(size=(n, D)))
    return X


class Bare:
    """Plain numpy E-step + statistics for fixed m_k, P_k, log weights c_k.

    log r_nk = c_k − ½ (x_n − m_k)ᵀ P_k (x_n − m_k) + const
             = Z_n · G_k with Z_n = [x_i x_j (i ≤ j) | x | 1]:
    G[(i,i)] = −½ P_ii, G[(i,j)] = −P_ij (i < j), G[x] = P m, G[1] = c − ½ mᵀPm.
    """

    def __init__(self, m, P, c):
        import numpy as np
        K, D = m.shape
        self.m, self.P, self.c = m, P, c
        self.iu, self.ju = np.triu_indices(D)
        T = self.iu.size
        self.T, self.D = T, D
        coef = np.where(self.iu == self.ju, -0.5, -1.0)
        G = np.empty((T + D + 1, K))
        G[:T] = (P[:, self.iu, self.ju] * coef).T
        Pm = np.einsum("kij,kj->ki", P, m)
        G[T:T + D] = Pm.T
        G[T + D] = c - 0.5 * np.einsum("ki,ki->k", m, Pm)
        self.G = G
        self.Gt = np.ascontiguousarray(G.T)

    def features(self, x):
        import numpy as np
        T, D = self.T, self.D
        Z = np.empty((x.shape[0], T + D + 1))
        np.multiply(x.take(self.iu, axis=1), x.take(self.ju, axis=1), out=Z[:, :T])
        Z[:, T:T + D] = x
        Z[:, T + D] = 1.0
        return Z

    def estep(self, x):
        """Responsibilities R (n, K) and statistics Rᵀ Z (K, T + D + 1)."""
        import numpy as np
        Z = self.features(x)
        L = Z @ self.G
        L -= L.max(axis=1, keepdims=True)
        np.exp(L, out=L)
        L /= L.sum(axis=1, keepdims=True)
        return L, L.T @ Z

    def features_t(self, x):
        """Z feature-major (T + D + 1, n): each block x_i · x_{i..D−1} is one product of rows."""
        import numpy as np
        T, D = self.T, self.D
        Zt = np.empty((T + D + 1, x.shape[0]))
        xt = Zt[T:T + D]
        xt[...] = x.T
        Zt[T + D] = 1.0
        o = 0
        for i in range(D):
            np.multiply(xt[i], xt[i:], out=Zt[o:o + D - i])
            o += D - i
        return Zt

    def estep_t(self, x):
        """Feature-major Z, component-major R (K, n); statistics R Zᵀ (K, T + D + 1)."""
        import numpy as np
        Zt = self.features_t(x)
        L = np.dot(self.Gt, Zt)
        L -= L.max(axis=0)
        np.exp(L, out=L)
        L /= L.sum(axis=0)
        return L, np.dot(L, Zt.T)

    def estep_einsum(self, x):
        """The straightforward version: einsum Mahalanobis terms and second moments."""
        import numpy as np
        diff = x[:, None, :] - self.m[None, :, :]
        maha = np.einsum("nkd,kde,nke->nk", diff, self.P, diff)
        L = self.c[None, :] - 0.5 * maha
        L -= L.max(axis=1, keepdims=True)
        R = np.exp(L)
        R /= R.sum(axis=1, keepdims=True)
        Nk = R.sum(axis=0)
        Sx = R.T @ x
        Sxx = np.einsum("nk,nd,ne->kde", R, x, x)
        return R, (Nk, Sx, Sxx)


def bare_from_lam(model, lam):
    """Fixed (m_k, P_k = ν_k W_k, c_k) equal to the model's E-step at λ."""
    import math

    import numpy as np
    from scipy.special import digamma
    alpha, beta, m, Winv, nu = model.standard(lam)
    D = m.shape[1]
    W = np.linalg.inv(Winv)
    P = nu[:, None, None] * W
    E_log_pi = digamma(alpha) - digamma(alpha.sum())
    E_logdet = (digamma(0.5 * (nu[:, None] - np.arange(D)[None, :])).sum(axis=1)
                + D * math.log(2.0) - np.linalg.slogdet(Winv)[1])
    c = E_log_pi + 0.5 * E_logdet - 0.5 * D * math.log(2 * math.pi) - 0.5 * D / beta
    return Bare(m, P, c)


def load_package_as(name, path):
    """Import the package directory ``path`` under the module name ``name``."""
    import importlib.util
    path = os.path.abspath(path)
    spec = importlib.util.spec_from_file_location(name, os.path.join(path, "__init__.py"),
                                                  submodule_search_locations=[path])
    if spec is None:
        raise SystemExit(f"--compare: no package in {path!r} (expected DIR/__init__.py)")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def per_call(fn, min_time=0.2, repeats=5):
    """Best µs per call of ``fn``."""
    return 1e6 / max(rate(fn, 1, min_time) for _ in range(repeats))


def interleaved(methods, n_records, rounds, min_time, chunk_time=0.01, progress=None,
                before_round=None):
    """Records/s of every method in every round, the methods taking turns.

    In each round the methods run in turn, in chunks of about ``chunk_time``
    seconds, until each has had ``min_time`` seconds; the starting method
    rotates between rounds. Returns ``{name: [records/s per round]}``.
    """
    import time
    calls = {}
    for name, fn in methods.items():                  # calls per chunk
        k, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < chunk_time:
            fn()
            k += 1
        calls[name] = k
    names = list(methods)
    runs = {m: [] for m in names}
    for r in range(rounds):
        if before_round:
            before_round(r)
        order = names[r % len(names):] + names[:r % len(names)]
        spent = dict.fromkeys(names, 0.0)
        done = dict.fromkeys(names, 0)
        while min(spent.values()) < min_time:
            for m in order:
                fn, k = methods[m], calls[m]
                t0 = time.perf_counter()
                for _ in range(k):
                    fn()
                spent[m] += time.perf_counter() - t0
                done[m] += k
        for m in names:
            runs[m].append(done[m] * n_records / spent[m])
        if progress:
            progress(r)
    return runs


def ratio_summary(num, den):
    """Per-round ratios num/den: (median, q1, q3, min, max, list)."""
    import numpy as np
    q = np.asarray(num) / np.asarray(den)
    return (float(np.median(q)), float(np.quantile(q, 0.25)), float(np.quantile(q, 0.75)),
            float(q.min()), float(q.max()), q.tolist())


def worker(args):
    import numpy as np

    from streamsvi import SVI, BayesianGMM, RobbinsMonro

    info = machine_info()
    threads = args._worker
    print("=" * 78)
    print(f"throughput with {threads} BLAS thread(s){' (--quick)' if args.quick else ''}")
    print("=" * 78)
    print(f"CPU: {info['cpu']}; logical CPUs {info['cpus']} (usable {info['affinity']})")
    print(f"Python {info['python']}, numpy {info['numpy']}, BLAS {info['blas']} "
          f"(runtime: {info['blas_runtime']})")
    print("env: " + " ".join(f"{k}={v}" for k, v in info["env"].items()))

    D, K, S, M = args.D, args.K, args.batch, args.M
    n_batches = 20
    X = make_data(D, K, S * n_batches, seed=0)
    batches = [np.ascontiguousarray(X[i * S:(i + 1) * S]) for i in range(n_batches)]
    N = len(X)
    print(f"setting: D={D}, K={K}, |S|={S}, SVI+ M={M:g}, N={N}, paper_prior(K, D), "
          f"RobbinsMonro(tau0=1, kappa=0.7); {args.repeats} interleaved rounds of "
          f">= {args.min_time:g} s per method in chunks of {args.chunk:g} s\n")

    sched = RobbinsMonro(tau0=1.0, kappa=0.7)
    m_svi, m_svip = BayesianGMM.paper_prior(K, D), BayesianGMM.paper_prior(K, D)
    svi = SVI(m_svi, N, sched)
    svip = SVI(m_svip, N, sched, effective_batch_size=M)
    # warm start: 40 SVI steps so that λ (and the responsibilities) are realistic
    state0, _ = svi.fit(svi.init(X, seed=0), X, 40, S)

    # the bare E-steps at the warm λ must be the model's E-step
    bare = bare_from_lam(m_svi, state0.lam)
    loc = m_svi.local_step(state0.lam, batches[0])
    ref = m_svi.suffstats(loc, batches[0])
    T = bare.T
    R, stats = bare.estep(batches[0])
    Rt, stats_t = bare.estep_t(batches[0])
    R2, (Nk2, Sx2, Sxx2) = bare.estep_einsum(batches[0])
    err_R = max(np.abs(R - loc.resp).max(), np.abs(Rt.T - loc.resp).max(), np.abs(R2 - loc.resp).max())
    err_S = 0.0
    for P in (stats, stats_t):
        err_S = max(err_S, np.abs(P[:, T + D] - ref["nu"]).max(), np.abs(P[:, T:T + D] - ref["beta_m"]).max(),
                    np.abs(P[:, :T] - ref["Psi"][:, bare.iu, bare.ju]).max()
                    / max(1.0, np.abs(ref["Psi"]).max()))
    err_S = max(err_S, np.abs(Nk2 - ref["nu"]).max(), np.abs(Sx2 - ref["beta_m"]).max(),
                np.abs(Sxx2 - ref["Psi"]).max() / max(1.0, np.abs(ref["Psi"]).max()))
    print(f"check: bare/einsum vs model responsibilities max |Δ| = {err_R:.1e}, "
          f"statistics max |Δ| (rel. for second moments) = {err_S:.1e}")
    if not (err_R < 1e-9 and err_S < 1e-9):
        print("!! the bare E-step does not reproduce the model's E-step; timings are not comparable")

    st = {"svi": state0, "svip": state0}
    ctr = {"svi": 0, "svip": 0, "bare": 0, "bare_rm": 0, "ein": 0}
    clipped = {"steps": 0, "n": 0}

    def step_svi():
        i = ctr["svi"] = ctr["svi"] + 1
        st["svi"], _ = svi.update(st["svi"], batches[i % n_batches])

    def step_svip():
        i = ctr["svip"] = ctr["svip"] + 1
        st["svip"], inf = svip.update(st["svip"], batches[i % n_batches])
        clipped["n"] += 1
        clipped["steps"] += inf.min_weight < 0

    # the bare E-steps run at the λ the SVI engine has reached (rebuilt before
    # every round, outside the timing), so they see the same responsibilities
    cur = {"bare": bare}

    def step_bare():
        i = ctr["bare"] = ctr["bare"] + 1
        cur["bare"].estep_t(batches[i % n_batches])

    def step_bare_rm():
        i = ctr["bare_rm"] = ctr["bare_rm"] + 1
        cur["bare"].estep(batches[i % n_batches])

    def step_ein():
        i = ctr["ein"] = ctr["ein"] + 1
        cur["bare"].estep_einsum(batches[i % n_batches])

    def refresh_bare(r):
        cur["bare"] = bare_from_lam(m_svi, st["svi"].lam)

    SVIP = f"streamsvi SVI+ (M={M:g})"
    methods = {"streamsvi SVI": step_svi, SVIP: step_svip, BARE: step_bare, BARE_RM: step_bare_rm,
               "einsum reference": step_ein}
    if args.compare:                     # an older streamsvi, same data, same rounds
        old = load_package_as("streamsvi_baseline", args.compare)
        o_svi = old.SVI(old.BayesianGMM.paper_prior(K, D), N, old.RobbinsMonro(tau0=1.0, kappa=0.7))
        o_svip = old.SVI(old.BayesianGMM.paper_prior(K, D), N, old.RobbinsMonro(tau0=1.0, kappa=0.7),
                         effective_batch_size=M)
        o0, _ = o_svi.fit(o_svi.init(X, seed=0), X, 40, S)
        st.update(o_svi=o0, o_svip=o0)
        ctr.update(o_svi=0, o_svip=0)

        def baseline_step(key, engine):
            def f():
                i = ctr[key] = ctr[key] + 1
                st[key], _ = engine.update(st[key], batches[i % n_batches])
            return f
        methods["baseline SVI"] = baseline_step("o_svi", o_svi)
        methods[f"baseline SVI+ (M={M:g})"] = baseline_step("o_svip", o_svip)
        print(f"baseline: streamsvi from {os.path.abspath(args.compare)}")
    for fn in methods.values():          # warm-up (allocations, caches)
        for _ in range(3):
            fn()
    load0, ct0 = os.getloadavg()[0], cpu_times()
    runs = interleaved(methods, S, args.repeats, args.min_time, chunk_time=args.chunk,
                       progress=lambda r: log(f"{threads} thread(s): round {r + 1}/{args.repeats} done"),
                       before_round=refresh_bare)
    ct1 = cpu_times()
    steal = (100.0 * (ct1[1] - ct0[1]) / max(1, ct1[0] - ct0[0])) if ct0 and ct1 else float("nan")
    print(f"machine load during timing: 1-min load average {load0:.2f} -> {os.getloadavg()[0]:.2f} "
          f"(this process adds ~1), CPU steal {steal:.1f}%")
    med = {m: float(np.median(v)) for m, v in runs.items()}
    rows = []
    for m, v in runs.items():
        r = ratio_summary(v, runs[BARE])
        rows.append([m, f"{max(v):,.0f}", f"{med[m]:,.0f}", f"{1e6 * S / med[m]:,.0f}",
                     f"{r[0]:.3f}", f"{r[3]:.3f}-{r[4]:.3f}"])
    print(fmt_table(["method", "records/s (best)", "records/s (median)", "µs/batch (median)",
                     "÷ bare (median)", "÷ bare (range)"], rows))
    print(f"(÷ bare: per-round ratio to {BARE!r}, median and range over {args.repeats} rounds)\n")

    def verdict(label, num, den):
        med_r, q1, q3, lo, hi, qs = ratio_summary(runs[num], runs[den])
        below = sum(q < TARGET for q in qs)
        print(f"{label} = {med_r:.3f} median (quartiles {q1:.3f}-{q3:.3f}, range {lo:.3f}-{hi:.3f}); "
              f"rounds below {TARGET}: {below}/{len(qs)}; target: {'MET' if med_r >= TARGET else 'NOT MET'}")
        return med_r
    r_svi = verdict("ratio streamsvi SVI / bare ", "streamsvi SVI", BARE)
    r_svip = verdict("ratio streamsvi SVI+ / bare", SVIP, BARE)
    r_svi_rm = verdict("ratio streamsvi SVI / bare (record-major)", "streamsvi SVI", BARE_RM)
    if args.compare:
        verdict("ratio baseline SVI / bare  ", "baseline SVI", BARE)
        verdict("ratio baseline SVI / bare (record-major)", "baseline SVI", BARE_RM)
        print(f"speed-up SVI over the baseline: "
              f"{ratio_summary(runs['streamsvi SVI'], runs['baseline SVI'])[0]:.2f}x, SVI+: "
              f"{ratio_summary(runs[SVIP], runs[f'baseline SVI+ (M={M:g})'])[0]:.2f}x (medians)")
    print(f"SVI+ steps with a negative weight (domain check run): {clipped['steps']}/{clipped['n']}")
    print(f"bare record-major / feature-major = {ratio_summary(runs[BARE_RM], runs[BARE])[0]:.3f}, "
          f"einsum reference / bare = {ratio_summary(runs['einsum reference'], runs[BARE])[0]:.3f} "
          f"(medians)")

    # ----------------------------------------------------- breakdown
    lam = st["svi"].lam
    x = batches[0]
    fresh = [lam.copy() for _ in range(8)]       # distinct objects: defeat the per-λ cache
    k = [0]

    def nxt():
        k[0] += 1
        return fresh[k[0] % 8]

    base_state = st["svi"]

    def update_fresh(engine):
        def f():
            engine.update(type(base_state)(base_state.step, nxt(), base_state.rng_state,
                                           base_state.records_seen), x)
        return f

    m_svi.local_step(lam, x)
    loc = m_svi.local_step(lam, x)
    w = 1.0 + np.random.default_rng(1).normal(0, 1, S)
    w -= w.mean() - 1.0
    stats = m_svi.suffstats(loc, x)
    target = m_svi.prior() + m_svi.suffstats(loc, x, w) * (N / S)
    pair = getattr(m_svi, "suffstats_pair", None)

    mt = min(0.2, args.min_time / 2)
    parts = [
        ("update, SVI (whole; a new λ every call)", update_fresh(svi)),
        ("update, SVI+ (whole; a new λ every call)", update_fresh(svip)),
        ("  check_batch", lambda: m_svi.check_batch(x)),
        ("  features t(x)", lambda: m_svi.features(x)),
        ("  per-λ expectations (Cholesky, inverse, digammas, E-step coefficients)",
         lambda: m_svi._expectations(nxt())),
        ("  local_step, cached λ (features + E-step)", lambda: m_svi.local_step(lam, x)),
        ("  suffstats (unweighted)", lambda: m_svi.suffstats(loc, x)),
        ("  suffstats_pair (weighted + unweighted, SVI+ only)",
         (lambda: pair(loc, x, w)) if pair else (lambda: (m_svi.suffstats(loc, x, w), m_svi.suffstats(loc, x)))),
        ("  global_elbo, cached λ", lambda: m_svi.global_elbo(lam)),
        ("  suffstats_sqnorm (grad-variance metric)", lambda: m_svi.suffstats_sqnorm(loc, x)),
        ("  max_step (SVI+ with a negative weight)", lambda: m_svi.max_step(lam, target)),
        ("  NatParams: target η + (N/|S|)·stats", lambda: m_svi.prior() + stats * (N / S)),
        ("  NatParams: blend (1 − ρ)λ + ρλ̂", lambda: lam * (1 - 0.1) + target * 0.1),
        (BARE, lambda: cur["bare"].estep_t(x)),
        (BARE_RM, lambda: cur["bare"].estep(x)),
    ]
    print("\nbreakdown (µs per call, best of 5, one batch; the per-λ work runs once per update):")
    if args.compare:                     # the same calls on the baseline, interleaved call by call
        o_m, o_e, o_ep = o_svi.model, o_svi, o_svip
        o_lam = st["o_svi"].lam
        o_fresh = [o_lam.copy() for _ in range(8)]
        o_loc = o_m.local_step(o_lam, x)
        o_stats = o_m.suffstats(o_loc, x)
        o_target = o_m.prior() + o_m.suffstats(o_loc, x, w) * (N / S)
        o_pair = getattr(o_m, "suffstats_pair", None)
        o_state = st["o_svi"]

        def o_nxt():
            k[0] += 1
            return o_fresh[k[0] % 8]

        def o_update_fresh(engine):
            def f():
                engine.update(type(o_state)(o_state.step, o_nxt(), o_state.rng_state,
                                            o_state.records_seen), x)
            return f
        o_parts = [o_update_fresh(o_e), o_update_fresh(o_ep), lambda: o_m.check_batch(x),
                   lambda: o_m.features(x), lambda: o_m._expectations(o_nxt()),
                   lambda: o_m.local_step(o_lam, x), lambda: o_m.suffstats(o_loc, x),
                   (lambda: o_pair(o_loc, x, w)) if o_pair else
                   (lambda: (o_m.suffstats(o_loc, x, w), o_m.suffstats(o_loc, x))),
                   lambda: o_m.global_elbo(o_lam), lambda: o_m.suffstats_sqnorm(o_loc, x),
                   lambda: o_m.max_step(o_lam, o_target), lambda: o_m.prior() + o_stats * (N / S),
                   lambda: o_lam * (1 - 0.1) + o_target * 0.1, None, None]
        rows = []
        for (name, fn), ofn in zip(parts, o_parts):
            a, b = [], []
            for _ in range(5):
                a.append(1e6 / rate(fn, 1, mt / 2))
                if ofn is not None:
                    b.append(1e6 / rate(ofn, 1, mt / 2))
            rows.append([name, f"{min(a):,.1f}", f"{min(b):,.1f}" if b else ""])
        print(fmt_table(["call", "µs", "µs (baseline)"], rows))
    else:
        rows = [[name, f"{per_call(fn, mt):,.1f}"] for name, fn in parts]
        print(fmt_table(["call", "µs"], rows))
    print()
    res = {"threads": threads, "machine": info, "rates": med, "runs": runs, "ratio_svi": r_svi,
           "ratio_svip": r_svip, "ratio_svi_rm": r_svi_rm, "D": D, "K": K, "batch": S, "M": M}
    if args._result:
        with open(args._result, "w") as f:
            json.dump(res, f)
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args._worker is None:
        return parent(args)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
