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
