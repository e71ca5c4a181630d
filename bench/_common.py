"""Helpers shared by the benchmark scripts: machine description, timing, tables."""
from __future__ import annotations

import time


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ("unknown" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                        "unknown")
    except OSError:
        return "unknown"


def blas_build() -> str:
    """numpy's BLAS as built ("name version")."""
    import numpy as np

    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - informational only
        return "unknown"


def rate(fn, n_records, min_time):
    """Records/s of one timed run of ``fn`` (repeated for at least ``min_time`` seconds)."""
    n = 0
    t0 = time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - t0
        if el >= min_time:
            return n * n_records / el


def fmt_table(header, rows, left: int = 1) -> str:
    """A text table; the first ``left`` columns left-aligned, the rest right-aligned."""
    cols = list(zip(*([header] + rows)))
    widths = [max(len(str(c)) for c in col) for col in cols]

    def line(r):
        return "  ".join(f"{str(c):<{w}}" if i < left else f"{str(c):>{w}}"
                         for i, (c, w) in enumerate(zip(r, widths)))
    return "\n".join([line(header), "-" * (sum(widths) + 2 * (len(widths) - 1))]
                     + [line(r) for r in rows])


def load_pima():
    """Pima Indians diabetes, X (768, 8) and y (768,), from Debian's ``weka`` package.

    streamsvi neither ships nor downloads it; the benchmarks use Weka's
    ``examples/diabetes.arff``: the cached copy, an installed weka, else
    ``apt-get download weka`` once into streamsvi's cache (as ``tests/_pima.py``).
    """
    from pathlib import Path

    from streamsvi import datasets

    member = "usr/share/doc/weka/examples/diabetes.arff"
    path = datasets.cache_dir() / "diabetes.arff"
    if not path.exists():
        installed = [p for p in (Path("/") / member, Path("/") / (member + ".gz")) if p.exists()]
        path = installed[0] if installed else datasets._apt_fetch_member(
            "weka", member, path, "Pima Indians diabetes")
    return datasets.load_pima(path)


def paired(a, b, tie):
    """Wins/ties/losses of ``a`` over ``b`` (paired by index), the mean difference ± its standard
    error, and the two-sided sign test's p (ties dropped); ``tie(b)`` is the tolerance of a tie."""
    import math

    import numpy as np

    from streamsvi.compare import sign_test

    a, b = np.asarray(a, float), np.asarray(b, float)
    d = a - b
    tol = tie(b)
    w, ls = int(np.sum(d > tol)), int(np.sum(d < -tol))
    se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
    return dict(wins=w, ties=len(d) - w - ls, losses=ls, mean_diff=float(d.mean()), se=se, sign_p=sign_test(w, ls))
