"""Update throughput (records/s) of streamsvi against a bare numpy E-step.

Setting: Bayesian GMM with D = 8, K = 10 (``BayesianGMM.paper_prior``), batches
of |S| = 1000 records drawn from a synthetic 10-cluster Gaussian mixture
(fixed seed), N = 20 000. Timed, in the same process and interleaved:

* ``streamsvi SVI``   — ``SVI.update(state, batch)`` with M = |S| (plain SVI);
* ``streamsvi SVI+``  — the same with M = 500 (noise weights, a second
  statistics pass and the domain check on most steps);
* ``bare numpy``      — the work an update cannot avoid, written as a good
  plain numpy E-step for *fixed* means m_k, precisions P_k and log weights:
  Z = [x_i x_j (i ≤ j) | x | 1] per record, log-responsibilities as ONE
  product Z @ G with a precomputed (T + D + 1) × K coefficient matrix G,
  a softmax, and the sufficient statistics as ONE product Rᵀ Z;
* ``einsum reference`` — the straightforward version: (x − m_k)ᵀ P_k (x − m_k)
  by einsum, softmax, N_k, Rᵀx and Σ_n r_nk x_n x_nᵀ by einsum.

The bare E-step is checked to give the model's responsibilities and
statistics (to 1e-9) before anything is timed. Each number is the best of 5
runs of ≥ 1 s (records/s = records processed / wall time). The streamsvi
updates take a ready batch (no sampling), as the daemon does. The ratio
streamsvi / bare is compared with the target 0.65. A per-call breakdown of
one streamsvi update follows.

BLAS threads: every setting runs in its own child process with
OPENBLAS_NUM_THREADS = OMP_NUM_THREADS = MKL_NUM_THREADS set before numpy is
imported; default 1 (multi-threaded BLAS is slower for these small matrices).

Run::

    python bench/throughput.py                # 1 BLAS thread, ~30 s
    python bench/throughput.py --threads 1,2  # both settings, side by side
    python bench/throughput.py --quick        # best of 3 runs of 0.25 s, < 1 min
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
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per method (default 5)")
    ap.add_argument("--min-time", type=float, default=None, help="seconds per timed run (default 1)")
    ap.add_argument("--_worker", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.min_time is None:
        args.min_time = 0.25 if args.quick else 1.0
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
        print("summary: records/s by BLAS threads (best of runs)")
        names = list(results[0]["rates"])
        hdr = ["method"] + [f"{r['threads']} thread(s)" for r in results]
        rows = [[m] + [f"{r['rates'][m]:,.0f}" for r in results] for m in names]
        rows.append(["ratio SVI / bare"] + [f"{r['ratio_svi']:.3f}" for r in results])
        rows.append(["ratio SVI+ / bare"] + [f"{r['ratio_svip']:.3f}" for r in results])
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
               label=f"{r['threads']} BLAS thread(s)")
    bare = results[0]["rates"]["bare numpy"]
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


def per_call(fn, min_time=0.2, repeats=5):
    """Best µs per call of ``fn``."""
    return 1e6 / max(rate(fn, 1, min_time) for _ in range(repeats))


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
          f"RobbinsMonro(tau0=1, kappa=0.7); best of {args.repeats} runs of >= {args.min_time:g} s\n")

    sched = RobbinsMonro(tau0=1.0, kappa=0.7)
    m_svi, m_svip = BayesianGMM.paper_prior(K, D), BayesianGMM.paper_prior(K, D)
    svi = SVI(m_svi, N, sched)
    svip = SVI(m_svip, N, sched, effective_batch_size=M)
    # warm start: 40 SVI steps so that λ (and the responsibilities) are realistic
    state0, _ = svi.fit(svi.init(X, seed=0), X, 40, S)

    # the bare E-step at the warm λ must be the model's E-step
    bare = bare_from_lam(m_svi, state0.lam)
    loc = m_svi.local_step(state0.lam, batches[0])
    R, stats = bare.estep(batches[0])
    R2, (Nk2, Sx2, Sxx2) = bare.estep_einsum(batches[0])
    ref = m_svi.suffstats(loc, batches[0])
    T = bare.T
    err_R = max(np.abs(R - loc.resp).max(), np.abs(R2 - loc.resp).max())
    err_S = max(np.abs(stats[:, T + D] - ref["nu"]).max(), np.abs(stats[:, T:T + D] - ref["beta_m"]).max(),
                np.abs(Nk2 - ref["nu"]).max(), np.abs(Sx2 - ref["beta_m"]).max(),
                np.abs(Sxx2 - ref["Psi"]).max() / max(1.0, np.abs(ref["Psi"]).max()))
    print(f"check: bare/einsum vs model responsibilities max |Δ| = {err_R:.1e}, "
          f"statistics max |Δ| (rel. for second moments) = {err_S:.1e}")
    if not (err_R < 1e-9 and err_S < 1e-9):
        print("!! the bare E-step does not reproduce the model's E-step; timings are not comparable")

    st = {"svi": state0, "svip": state0}
    ctr = {"svi": 0, "svip": 0, "bare": 0, "ein": 0}
    clipped = {"steps": 0, "n": 0}

    def step_svi():
        i = ctr["svi"] = ctr["svi"] + 1
        st["svi"], _ = svi.update(st["svi"], batches[i % n_batches])

    def step_svip():
        i = ctr["svip"] = ctr["svip"] + 1
        st["svip"], inf = svip.update(st["svip"], batches[i % n_batches])
        clipped["n"] += 1
        clipped["steps"] += inf.min_weight < 0

    def step_bare():
        i = ctr["bare"] = ctr["bare"] + 1
        bare.estep(batches[i % n_batches])

    def step_ein():
        i = ctr["ein"] = ctr["ein"] + 1
        bare.estep_einsum(batches[i % n_batches])

    methods = {"streamsvi SVI": step_svi, f"streamsvi SVI+ (M={M:g})": step_svip,
               "bare numpy": step_bare, "einsum reference": step_ein}
    for fn in methods.values():          # warm-up (allocations, caches)
        for _ in range(3):
            fn()
    runs = {m: [] for m in methods}
    load0, ct0 = os.getloadavg()[0], cpu_times()
    for r in range(args.repeats):
        order = list(methods) if r % 2 == 0 else list(methods)[::-1]
        for m in order:
            runs[m].append(rate(methods[m], S, args.min_time))
        log(f"{threads} thread(s): repeat {r + 1}/{args.repeats} done")
    ct1 = cpu_times()
    steal = (100.0 * (ct1[1] - ct0[1]) / max(1, ct1[0] - ct0[0])) if ct0 and ct1 else float("nan")
    print(f"machine load during timing: 1-min load average {load0:.2f} -> {os.getloadavg()[0]:.2f} "
          f"(this process adds ~1), CPU steal {steal:.1f}%")
    best = {m: max(v) for m, v in runs.items()}
    bare_rate = best["bare numpy"]
    rows = []
    for m, v in runs.items():
        rows.append([m, f"{best[m]:,.0f}", f"{np.median(v):,.0f}", f"{1e6 * S / best[m]:,.0f}",
                     f"{best[m] / bare_rate:.3f}"])
    print(fmt_table(["method", "records/s (best)", "records/s (median)", "µs/batch", "÷ bare"], rows))
    r_svi = best["streamsvi SVI"] / bare_rate
    r_svip = best[f"streamsvi SVI+ (M={M:g})"] / bare_rate
    print(f"\nratio streamsvi SVI / bare  = {r_svi:.3f}  (target {TARGET}: "
          f"{'MET' if r_svi >= TARGET else 'NOT MET'})")
    print(f"ratio streamsvi SVI+ / bare = {r_svip:.3f}  (target {TARGET}: "
          f"{'MET' if r_svip >= TARGET else 'NOT MET'}); SVI+ steps with a negative weight "
          f"(domain check run): {clipped['steps']}/{clipped['n']}")
    print(f"einsum reference / bare     = {best['einsum reference'] / bare_rate:.3f}")

    # ----------------------------------------------------- breakdown
    lam = st["svi"].lam
    x = batches[0]
    fresh = [lam.copy() for _ in range(8)]       # distinct objects: defeat the per-λ cache
    k = [0]

    def local_fresh():
        k[0] += 1
        m_svi.local_step(fresh[k[0] % 8], x)

    m_svi.local_step(lam, x)
    loc = m_svi.local_step(lam, x)
    w = 1.0 + np.random.default_rng(1).normal(0, 1, S)
    w -= w.mean() - 1.0
    target = m_svi.prior() + m_svi.suffstats(loc, x, w) * (N / S)

    def global_fresh():
        k[0] += 1
        m_svi.global_elbo(fresh[k[0] % 8])

    mt = min(0.2, args.min_time / 2)
    parts = [
        ("update, SVI (whole)", lambda: svi.update(st["svi"], x)),
        ("update, SVI+ (whole)", lambda: svip.update(st["svi"], x)),
        ("  local_step, new λ (per-λ expectations + E-step)", local_fresh),
        ("  local_step, cached λ (E-step only)", lambda: m_svi.local_step(lam, x)),
        ("  suffstats (unweighted)", lambda: m_svi.suffstats(loc, x)),
        ("  suffstats (weighted, SVI+ only)", lambda: m_svi.suffstats(loc, x, w)),
        ("  global_elbo, new λ (incl. expectations)", global_fresh),
        ("  global_elbo, cached λ", lambda: m_svi.global_elbo(lam)),
        ("  suffstats_sqnorm (grad-variance metric)", lambda: m_svi.suffstats_sqnorm(loc, x)),
        ("  max_step (SVI+ with a negative weight)", lambda: m_svi.max_step(lam, target)),
        ("  NatParams: prior + stats·scale, λ update", lambda: (1 - 0.1) * lam + 0.1 * target),
        ("bare numpy E-step + stats", lambda: bare.estep(x)),
    ]
    print("\nbreakdown (µs per call, best of 5, one batch; the per-λ work runs once per update):")
    rows = [[name, f"{per_call(fn, mt):,.1f}"] for name, fn in parts]
    print(fmt_table(["call", "µs"], rows))
    print()
    res = {"threads": threads, "machine": info, "rates": best, "runs": runs, "ratio_svi": r_svi,
           "ratio_svip": r_svip, "D": D, "K": K, "batch": S, "M": M}
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
