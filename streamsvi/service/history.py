"""The daemon's compact metric history and ``streamsvi report``.

The daemon appends one JSON object per kept update to ``history.jsonl`` next
to its snapshots (every ``metrics.history_every`` updates, and every update
that computed the held-out log-likelihood), after each durable checkpoint.
:func:`read_history` reads it back (the last row of a step wins: a replay
after a crash may write a step twice); :func:`plot_report` draws ELBO,
held-out log-likelihood, gradient variance and ρ over steps for one run or
several side by side.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

HISTORY_FILE = "history.jsonl"
PANELS = [("elbo_per_record", "minibatch ELBO / N (nats per record)", False),
          ("heldout_loglik", "held-out log p(x) per record (nats)", False),
          ("grad_variance", "gradient variance: N² tr Σ̂ / M (solid), step-to-step (dotted)", True),
          ("rho", "step size ρ_t", True)]


def read_history(path) -> list[dict]:
    """Rows of a checkpoint directory's ``history.jsonl`` (or the file itself), by step."""
    p = Path(path)
    f = p / HISTORY_FILE if p.is_dir() else p
    if not f.exists():
        raise FileNotFoundError(f"no metric history at {f}: is {p} a daemon's checkpoint directory "
                                f"(metrics.history_every writes {HISTORY_FILE} at each checkpoint)?")
    by_step = {}
    for lineno, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            by_step[int(row["step"])] = row
        except (ValueError, KeyError, TypeError):
            # a torn last line after a crash: skip it, say so
            import logging
            logging.getLogger("streamsvi.history").warning("%s line %d is not a history row; skipped",
                                                           f, lineno)
    return [by_step[k] for k in sorted(by_step)]


def plot_report(runs: dict, output) -> Path:
    """Draw the 4-panel report for ``{label: rows}`` into the PNG ``output``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the install
        raise RuntimeError("streamsvi report needs matplotlib: pip install 'streamsvi[report]'") from None
    fig, axes = plt.subplots(2, 2, figsize=(12, 8), constrained_layout=True)
    for ax, (key, title, log) in zip(axes.ravel(), PANELS):
        for i, (label, rows) in enumerate(runs.items()):
            color = f"C{i % 10}"
            pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None
                   and math.isfinite(r[key]) and (not log or r[key] > 0)]
            if pts:
                ax.plot(*zip(*pts), color=color, label=label, lw=1.2)
            if key == "grad_variance":
                obs = [(r["step"], r["grad_variance_observed"]) for r in rows
                       if r.get("grad_variance_observed") and r["grad_variance_observed"] > 0]
                if obs:
                    ax.plot(*zip(*obs), color=color, ls=":", lw=1.2)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if log:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
