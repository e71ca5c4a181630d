"""The daemon's compact metric history and ``streamsvi report``.

The daemon appends one JSON object per kept update to ``history.jsonl`` next
to its snapshots (every ``metrics.history_every`` updates, and every update
that computed the held-out log-likelihood), after each durable checkpoint.
With prequential evaluation (``metrics.evaluation``, the default) a row carries
``prequential_loglik`` (the minibatch's log predictive density before it was
learned), ``prequential_smoothed`` and, for a classifier, ``prequential_log_loss``
and ``prequential_accuracy``; with the reservoir, ``heldout_loglik`` (and
``heldout_log_loss``, ``heldout_accuracy``). The report draws either in the same
held-out panels (:data:`PREQUENTIAL`, :func:`held_out`).
:func:`read_history` reads it back (the last row of a step wins: a replay
after a crash may write a step twice); :func:`plot_report` draws ELBO, the
held-out quantity of each model (log p(x) per record for a density model,
log-loss and accuracy for a classifier), gradient variance and ρ over steps
for one run or several side by side (:func:`report_figure` is the figure).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

HISTORY_FILE = "history.jsonl"
#: The report's panels: (row key, title, log scale, the runs drawn: "all", "density" (models
#: of p(x)) or "classifier" (models of p(y | x), whose rows carry ``heldout_log_loss``)).
#: A panel for density models or classifiers is drawn when a run of that sort is in the report.
PANELS = [("elbo_per_record", "minibatch ELBO / N (nats per record)", False, "all"),
          ("heldout_loglik", "held-out log p(x) per record (nats)", False, "density"),
          ("heldout_log_loss", "held-out log-loss, −log p(y | x) per record (nats, lower is better)",
           False, "classifier"),
          ("heldout_accuracy", "held-out accuracy (fraction of labels predicted)", False, "classifier"),
          ("grad_variance", "gradient variance: N² tr Σ̂ / M (solid), step-to-step (dotted)", True, "all"),
          ("rho", "step size ρ_t", True, "all")]
#: The prequential figure a row carries in place of each reservoir figure (the report's held-out
#: panels draw whichever a row has).
PREQUENTIAL = {"heldout_loglik": "prequential_loglik", "heldout_log_loss": "prequential_log_loss",
               "heldout_accuracy": "prequential_accuracy"}
#: At most about this many markers on a series (every point of a shorter one is marked, so a
#: series of one point is seen).
MARKERS_PER_SERIES = 40


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


def held_out(row: dict, key: str):
    """A row's held-out figure ``key`` (``heldout_loglik``, ``heldout_log_loss``,
    ``heldout_accuracy``): the reservoir's, else the prequential one (:data:`PREQUENTIAL`), or None."""
    value = row.get(key)
    if value is None and key in PREQUENTIAL:
        value = row.get(PREQUENTIAL[key])
    return value


def is_classifier(rows: list[dict]) -> bool:
    """Whether a run's history is a classifier's: its held-out rows carry ``heldout_log_loss``
    or ``prequential_log_loss`` (the daemon writes them for models of p(y | x): logistic, softmax)."""
    return any(held_out(r, "heldout_log_loss") is not None for r in rows)


def report_panels(runs: dict) -> list[tuple]:
    """The :data:`PANELS` a report of ``{label: rows}`` draws: every "all" panel, the density
    models' held-out panel if one run is not a classifier, the classifiers' two if one is."""
    sorts = {"all"} | {"classifier" if is_classifier(rows) else "density" for rows in runs.values()}
    return [p for p in PANELS if p[3] in sorts]


def _points(rows, key, log):
    vals = [(r["step"], held_out(r, key)) for r in rows]
    return [(s, v) for s, v in vals if v is not None and math.isfinite(v) and (not log or v > 0)]


def _markevery(n: int) -> int:
    return max(1, math.ceil(n / MARKERS_PER_SERIES))


def report_figure(runs: dict):
    """The report's matplotlib figure for ``{label: rows}`` (the caller closes it).

    One panel per quantity of :func:`report_panels` (ELBO, held-out log p(x) for density
    models, held-out log-loss and accuracy for classifiers, gradient variance, ρ), two
    rows of them; every series is marked (at most :data:`MARKERS_PER_SERIES` markers, so
    a series of one point shows) and every panel with data has a legend of its runs.
    A run is drawn in a held-out panel of its own sort only (:func:`is_classifier`).
    """
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - depends on the install
        raise RuntimeError("streamsvi report needs matplotlib: pip install 'streamsvi[report]'") from None
    panels = report_panels(runs)
    cols = math.ceil(len(panels) / 2)
    fig, axes = plt.subplots(2, cols, figsize=(6 * cols, 8), constrained_layout=True, squeeze=False)
    for ax in axes.ravel()[len(panels):]:
        ax.set_visible(False)
    for ax, (key, title, log, sort) in zip(axes.ravel(), panels):
        for i, (label, rows) in enumerate(runs.items()):
            if sort != "all" and (sort == "classifier") != is_classifier(rows):
                continue
            color = f"C{i % 10}"
            pts = _points(rows, key, log)
            if pts:
                ax.plot(*zip(*pts), color=color, label=label, lw=1.2, marker="o", ms=3,
                        markevery=_markevery(len(pts)))
            if key == "grad_variance":
                obs = _points(rows, "grad_variance_observed", True)
                if obs:
                    ax.plot(*zip(*obs), color=color, ls=":", lw=1.2, marker="x", ms=3,
                            markevery=_markevery(len(obs)), label="_nolegend_")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if log and ax.lines:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
        if any(not ln.get_label().startswith("_") for ln in ax.lines):
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no values in these runs", ha="center", va="center",
                    transform=ax.transAxes, color="0.5")
    return fig


def plot_report(runs: dict, output) -> Path:
    """Draw the report for ``{label: rows}`` (:func:`report_figure`) into the PNG ``output``."""
    fig = report_figure(runs)        # says what to install when matplotlib is missing
    import matplotlib.pyplot as plt

    try:
        out = Path(output)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=110)
    finally:
        plt.close(fig)
    return out
