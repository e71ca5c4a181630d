"""Compare inference methods on a user's own records, for any model a config describes.

``streamsvi compare --config FILE --data RECORDS`` is a thin front end to
:func:`compare`: the CLI parses and prints, everything else is here.

What one comparison does:

1. Builds the model of the config's ``[model]`` table (``service/config.py``).
2. Reads the records file (:func:`read_records_file`): JSON lines decoded by
   the config's record kind and codec, exactly as the daemon decodes one
   message of a topic or one line of a file source, with the config's
   ``[validation]`` checks and the model's own; or the kind's usual file
   format (``streamsvi.io.inputs.FILE_FORMATS``: CSV, LDA-C, ``u.data``,
   sequences). A malformed line is an error that names its line.
3. Holds out a seeded fraction of the records (:func:`split_held_out`).
4. Runs every method from the same starts: start ``i`` of every method is the
   engine's ``init(train, seed + 1000 i + 1)``, so the methods differ only in
   how they update. N is the number of training records (the config's
   ``n_total`` describes its stream, not this file).

   * Conjugate models (the natural-gradient engine, ``SVI``): one row per
     annealer (``none`` = plain SVI, ``svi+``, ``deterministic``,
     ``stochastic``; :mod:`streamsvi.inference.annealing`), each with the
     config's settings for it when the config's ``[inference.annealing]`` is
     of that kind, else the annealer's defaults. ``svi+`` gets one row per M.
   * The gradient path (logistic, softmax; ``GradientVI``): one row per
     estimator (``legrad``, ``regrad``, ``ldgrad``), everything else as the
     config sets it.

5. Reports per method: the final ELBO per training record, the held-out
   measure (:data:`HELD_OUT`), the fit's wall time, and wins/ties/losses of
   its final ELBO against the first method, start by start, with a two-sided
   sign test (ties dropped).

The ELBO of the conjugate models is the engine's full-data ELBO with optimal
local factors (``SVI.elbo``; ``model.elbo(λ, aux, x)`` for the row-wise
models, PMF and HPF). The gradient path has no closed form: its ELBO is
E_q[log p(y | w)] by Monte Carlo over :data:`GRADIENT_ELBO_DRAWS` draws from q,
the same draws for every method (common random numbers), minus the exact
KL(q ‖ p).

Examples
--------
>>> sign_test(8, 2)          # 8 wins and 2 losses out of 10 starts
0.109375
>>> sign_test(0, 0)
1.0
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .inference.annealing import KINDS as ANNEALING_KINDS
from .inference.gradients import ESTIMATORS as GRADIENT_ESTIMATORS

__all__ = ["compare", "compare_methods", "check_methods", "read_records_file", "split_held_out", "sign_test",
           "format_table", "plot_traces", "Comparison", "MethodRow", "ANNEALERS", "ESTIMATORS", "HELD_OUT",
           "GRADIENT_ELBO_DRAWS", "TRACE_DRAWS", "TIE_RTOL", "SEGMENTS"]

#: ``--annealers`` names (conjugate models): the annealing kinds of :mod:`streamsvi.inference.annealing`
ANNEALERS = ANNEALING_KINDS
#: ``--estimators`` names (the gradient path: logistic, softmax): :mod:`streamsvi.inference.gradients`'s
ESTIMATORS = GRADIENT_ESTIMATORS
#: record kind -> (the held-out measure's name, what its sum of log densities is divided by)
HELD_OUT = {
    "bow": ("held-out bound/word", "words"),          # LDA: the per-word held-out bound
    "sequences": ("held-out lp/symbol", "symbols"),   # HMM: variational predictive per symbol
    "ratings": ("held-out lp/rating", "records"),
    "labelled": ("held-out log p(y|x)", "records"),
    "dense": ("held-out lp/record", "records"),
}
#: draws from q behind the gradient path's final ELBO (module docs)
GRADIENT_ELBO_DRAWS = 512
#: ... and behind each trace point of ``--plot`` (fewer: a trace is drawn, not tested)
TRACE_DRAWS = 64
#: two final ELBOs per record closer than this (relative to the reference's) are a tie
TIE_RTOL = 1e-6
#: fits are timed in this many segments (progress lines, and trace points for --plot)
SEGMENTS = 20


@dataclass
class MethodRow:
    """One method's results over the starts (lists are per start, in start order)."""

    label: str
    elbo: list = field(default_factory=list)          # final ELBO / training record
    held_out: list = field(default_factory=list)      # the held-out measure (HELD_OUT)
    seconds: list = field(default_factory=list)       # wall time of the fit
    traces: list = field(default_factory=list)        # per start: [(seconds, ELBO/record), ...] or []
    wins: int = 0
    ties: int = 0
    losses: int = 0
    sign_p: float = float("nan")


@dataclass
class Comparison:
    """The result of :func:`compare`: one :class:`MethodRow` per method, the first the reference."""

    rows: list
    model_kind: str
    what: str
    n_train: int
    n_held_out: int
    held_out_name: str
    settings: str
    inits: int


# ---------------------------------------------------------------------- records

def read_records_file(cfg: dict, path, fmt: str | None = None):
    """The records of ``path`` for the config ``cfg`` (validated): ``(model, kind, Records)``.

    ``fmt``: ``"jsonl"`` (one record per line, in the config's codec: ``json``,
    or ``text`` for an LDA config with a vocabulary; a ``binary`` config reads
    JSON lines), ``"native"`` (the record kind's usual file format,
    ``streamsvi.io.inputs.FILE_FORMATS``) or None: ``jsonl`` for a file named
    ``*.jsonl``, ``*.ndjson`` or ``*.json``, else ``native``.

    Raises ``ValueError`` naming the file and line of the first record that
    cannot be decoded or fails the config's ``[validation]`` or the model's
    checks, and for a file without records.
    """
    from .io.codecs import DecodeError, decode_many_safely, decode_rows_safely
    from .io.inputs import FILE_FORMATS, Records, read_records
    from .io.records import record_kind
    from .io.validate import ModelChecked, all_valid_safely, validate_safely
    from .service.config import build_model

    model = build_model(cfg["model"])
    kind = record_kind(model)
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--data: {path} " + ("is not a file" if path.exists() else "does not exist")
                         + "; give the file of records")
    if fmt is None:
        fmt = "jsonl" if path.suffix.lower() in (".jsonl", ".ndjson", ".json") else "native"
    if fmt not in ("jsonl", "native"):
        raise ValueError(f"format must be 'jsonl' or 'native', got {fmt!r}")
    validator = ModelChecked(kind.make_validator(model, dict(cfg.get("validation") or {})),
                             model.check_batch, kind)
    if fmt == "native":
        if kind.name not in FILE_FORMATS:
            raise ValueError(f"{kind.name!r} records have no native file format; give JSON lines (.jsonl)")
        recs = read_records(kind.name, path, model)
        good, rejected = validate_safely(validator, kind, recs.part)
        if rejected:
            i, reason, message = rejected[0]
            raise ValueError(f"{path}, record {i + 1}: {reason}: {message}")
        return model, kind, Records(good, recs.what)
    src = cfg["source"]
    codec_name = src["codec"] if src["codec"] in ("json", "text") else "json"
    codec = kind.make_codec(codec_name, model, {**src, **(cfg.get("records") or {})})
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"--data: cannot read {path}: {exc.strerror or exc}") from None
    numbers, payloads = [], []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            numbers.append(n)
            payloads.append(line.strip())
    if not payloads:
        raise ValueError(f"{path}: no records (an empty file)")
    fast = None
    if max(map(len, payloads)) <= validator.max_message_bytes:
        fast = decode_many_safely(codec, payloads)
    if fast is not None and kind.n_records(fast) == len(payloads) and all_valid_safely(validator, fast):
        part = fast
    else:                                       # one by one: find and name the first bad line
        parts = []
        for n, payload in zip(numbers, payloads):
            problem = validator.check_size(payload)
            if problem is not None:
                raise ValueError(f"{path}, line {n}: {problem[0]}: {problem[1]}")
            try:
                p = decode_rows_safely(codec, payload)
            except DecodeError as exc:
                raise ValueError(f"{path}, line {n}: {exc.reason}: {exc.message}") from None
            if kind.n_records(p) != 1:
                raise ValueError(f"{path}, line {n}: a line must hold one record, got {kind.n_records(p)}")
            parts.append(p)
        part = kind.concat(parts)
        good, rejected = validate_safely(validator, kind, part)
        if rejected:
            i, reason, message = rejected[0]
            raise ValueError(f"{path}, line {numbers[i]}: {reason}: {message}")
        part = good
    return model, kind, Records(part, f"{kind.n_records(part)} {kind.name} records from {path}")


def split_held_out(kind, part, fraction: float, seed: int = 0):
    """``(train, held_out)``: a seeded random ``fraction`` of the records held out (at least one
    of each when ``fraction > 0``; ``fraction = 0`` holds none out and gives ``held_out = None``)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"--held-out must be in [0, 1), got {fraction}")
    n = kind.n_records(part)
    if fraction == 0:
        return part, None
    if n < 2:
        raise ValueError(f"{n} record: too few to hold any out; give more records or --held-out 0")
    n_test = min(max(1, int(round(fraction * n))), n - 1)
    perm = np.random.default_rng(seed).permutation(n)
    return kind.take(part, np.sort(perm[n_test:])), kind.take(part, np.sort(perm[:n_test]))


# ---------------------------------------------------------------------- methods

def _is_gradient(model) -> bool:
    from .models.base import GradientModel

    return isinstance(model, GradientModel)


def _schedule(inf: dict, tau0, kappa):
    from .inference import Constant, RobbinsMonro

    if inf["schedule"] == "constant" and tau0 is None and kappa is None:
        return Constant(inf["rho"]), f"constant rho={inf['rho']:g}"
    t0 = inf["tau0"] if tau0 is None else tau0
    k = inf["kappa"] if kappa is None else kappa
    if not 0.5 < k <= 1:
        raise ValueError(f"--kappa must be in (0.5, 1], got {k:g}")
    if t0 < 0:
        raise ValueError(f"--tau0 must be >= 0, got {t0:g}")
    return RobbinsMonro(t0, k, inf["rho_min"]), f"rho_t=({t0:g}+t)^-{k:g}"


def _conjugate_methods(cfg, model, N, S, annealers, m, full_batch, sched):
    """``[(label, engine, batch size or None)]`` for the annealers of a conjugate model."""
    from .inference import Constant
    from .inference.annealing import Deterministic, NoAnnealing, Stochastic, SVIPlus, annealer_from_dict
    from .service.config import build_engine

    inf = cfg["inference"]
    base = build_engine(cfg, float(N), model=model)     # boundary_fraction, short_batches = "svi", ...
    configured = inf.get("annealing")          # the config's own annealer, settings resolved
    Ms = list(m) if m else []
    if not Ms:
        if configured and configured.get("kind") == "svi+":
            Ms = [None]                        # the config's SVI+ annealer as it is
        elif inf["effective_batch_size"] is not None:
            Ms = [inf["effective_batch_size"]]
        elif inf["effective_fraction"] is not None:
            Ms = [inf["effective_fraction"] * S]
        else:
            Ms = [max(1.0, S / 4.0)]
    out = []
    for name in annealers:
        if name == "svi+":
            for M in Ms:
                if M is None:
                    ann = annealer_from_dict(configured)          # the config's own, e.g. a growing M
                    c = ann.to_dict()
                    label = ("svi+ " + (f"M={c['M0']:g}" if c.get("M0") is not None else
                                        f"fraction={c['fraction']:g}")
                             + ("" if c.get("schedule", "constant") == "constant" else f" {c['schedule']}"))
                else:
                    if not 0 < M <= (N if full_batch else S):
                        raise ValueError(f"--m: M must be in (0, {'N' if full_batch else '|S|'}="
                                         f"{N if full_batch else S}], got {M:g}")
                    ann, label = SVIPlus(float(M)), f"svi+ M={M:g}"
                out.append((label, _svi(base, sched, ann), None if full_batch else S))
            continue
        if configured and configured.get("kind") == name:
            ann = annealer_from_dict(configured)
        else:
            ann = {"none": NoAnnealing, "deterministic": Deterministic, "stochastic": Stochastic}[name]()
        rho = Constant(1.0) if full_batch else sched
        out.append((name, _svi(base, rho, ann), None if full_batch else S))
    return out


def _svi(base, schedule, annealer):
    """The config's SVI engine ``base`` with another schedule and annealer (its other settings kept)."""
    from dataclasses import replace

    return replace(base, schedule=schedule, annealer=annealer, effective_batch_size=None,
                   effective_fraction=None)


def _gradient_methods(cfg, model, N, S, estimators, sched):
    """``[(label, engine, |S|)]``: for each estimator, the engine of the config with ``inference.estimator``
    set to it (every other ``[inference]`` setting of the gradient path kept; the settings left unset take
    that estimator's defaults, e.g. ``kl`` and ``n_samples``)."""
    import copy
    from dataclasses import replace

    from .service.config import build_engine

    out = []
    for est in estimators:
        c = copy.deepcopy(cfg)
        c["inference"]["estimator"] = est
        out.append((est, replace(build_engine(c, float(N), model=model), schedule=sched), S))
    return out


def _still_annealing(ann, steps: int) -> str:
    """A phrase when the annealer ``ann`` has not finished by step ``steps``, else ''."""
    from .inference.annealing import Deterministic, Stochastic

    if isinstance(ann, Deterministic) and ann.level(steps) > 1.0 + 1e-3:
        return f"the temperature is T = {ann.level(steps):.3g} at the last step ({steps})"
    if isinstance(ann, Stochastic) and ann.level(steps) > 1e-3:
        return f"the restart weight is {ann.level(steps):.3g} at the last step ({steps})"
    return ""


# ---------------------------------------------------------------------- measures

def _units(kind, part) -> float:
    """What the held-out measure divides by (:data:`HELD_OUT`)."""
    how = HELD_OUT.get(kind.name, ("", "records"))[1]
    if how == "words":
        return float(part.sum())
    if how == "symbols":
        return float(part.n_symbols_total)
    return float(kind.n_records(part))


def _gradient_elbo(engine, lam, X, eps) -> float:
    """E_q[log p(y | w)] over the draws w = μ + L ε (``eps``: (draws, P)), minus KL(q ‖ p) exactly."""
    model = engine.model
    mu = np.asarray(lam["mean"], float)
    cov = engine.covariance_matrix(lam)
    L = np.linalg.cholesky(cov + 1e-300 * np.eye(len(mu)))
    W = mu[None, :] + eps @ L.T
    ell = 0.0
    for i in range(0, X.shape[0], 2000):
        ell += float(np.sum(np.mean(model.loglik(W, X[i:i + 2000]), axis=0)))
    m0, v0 = model.prior_moments()
    d = mu - m0
    logdet = 2.0 * float(np.sum(np.log(np.diag(L))))
    kl = 0.5 * (float(np.sum(np.diag(cov) / v0)) + float(np.sum(d * d / v0)) - len(mu)
                + float(np.sum(np.log(v0))) - logdet)
    return ell - kl


def _elbo(engine, state, X, eps=None) -> float:
    from .inference.blocks import is_rowwise

    model = engine.model
    if eps is not None:
        return _gradient_elbo(engine, state.lam, X, eps)
    if is_rowwise(model):
        return float(model.elbo(state.lam, state.aux, X))
    return float(engine.elbo(state.lam, X))


def sign_test(wins: int, losses: int) -> float:
    """Two-sided sign test of ``wins`` against ``losses`` (ties dropped): 1 when there are none."""
    n = wins + losses
    if n == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(wins, n, 0.5).pvalue)


# ---------------------------------------------------------------------- driver

def check_methods(model_kind: str, *, annealers=None, estimators=None, m=None, full_batch=False):
    """``(annealers, estimators)`` for ``model.kind = model_kind``, defaults filled in (the other one
    None); ``ValueError`` for a flag that does not apply to the model, saying which one does.

    >>> check_methods("lda", annealers=["none", "svi+"])
    (['none', 'svi+'], None)
    >>> check_methods("logistic")
    (None, ['legrad', 'regrad', 'ldgrad'])
    >>> check_methods("pmf", annealers=["deterministic"])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --annealers: deterministic not defined for model.kind = 'pmf' (...); it takes none, svi+
    """
    from .models.base import GradientModel
    from .service.config import model_class

    cls = model_class(model_kind)
    if issubclass(cls, GradientModel):
        for flag, given in (("--annealers", annealers), ("--m", m), ("--full-batch", full_batch)):
            if given:
                raise ValueError(f"{flag} applies to the conjugate models (annealing); model.kind = "
                                 f"{model_kind!r} is on the gradient path: compare its estimators with "
                                 f"--estimators {','.join(ESTIMATORS)}")
        estimators = list(estimators or ESTIMATORS)
        bad = [e for e in estimators if e not in ESTIMATORS]
        if bad:
            raise ValueError(f"--estimators: {', '.join(bad)} unknown; expected {', '.join(ESTIMATORS)}")
        return None, estimators
    kinds = tuple(cls.annealing_kinds)
    if estimators:
        from .models import CONFIG_KINDS

        gradient = ", ".join(k for k, c in CONFIG_KINDS.items() if issubclass(c, GradientModel))
        raise ValueError(f"--estimators applies to the gradient path (model.kind = {gradient}); "
                         f"model.kind = {model_kind!r} is conjugate: compare its annealers with --annealers "
                         f"{','.join(kinds)}")
    annealers = list(annealers or kinds)
    unknown = [a for a in annealers if a not in ANNEALERS]
    if unknown:
        raise ValueError(f"--annealers: {', '.join(unknown)} unknown; expected {', '.join(ANNEALERS)}")
    bad = [a for a in annealers if a not in kinds]
    if bad:
        raise ValueError(f"--annealers: {', '.join(bad)} not defined for model.kind = {model_kind!r} (it has "
                         f"no local latent assignments to temper or restart); it takes {', '.join(kinds)}")
    return annealers, None


def compare_methods(cfg: dict, model, kind, train, held_out=None, *, annealers=None, estimators=None,
                    m=None, inits: int = 5, epochs: float = 10.0, batch_size: int | None = None,
                    full_batch: bool = False, tau0: float | None = None, kappa: float | None = None,
                    seed: int = 0, trace: bool = False, progress=None, what: str = "") -> Comparison:
    """Run the methods on ``train`` from the same starts; see the module docs.

    Parameters
    ----------
    cfg : dict
        A validated config (``service.config.load_config``); ``model`` and ``kind`` as
        :func:`read_records_file` returns them.
    train, held_out
        Parts of ``kind`` (``held_out`` may be None: no held-out measure).
    annealers : sequence of str, optional
        Conjugate models: :data:`ANNEALERS` names (default: all the model supports). Refused for
        the gradient path.
    estimators : sequence of str, optional
        The gradient path: :data:`ESTIMATORS` names (default: all three). Refused for conjugate models.
    m : sequence of float, optional
        SVI+ effective batch sizes M, one ``svi+`` row each (default: the config's M, else |S|/4).
    inits : int
        Starts per method.
    epochs : float
        Passes over the training records: ``round(epochs · N / |S|)`` steps (with ``full_batch``:
        ``epochs`` steps of the whole set).
    batch_size : int, optional
        |S| (default: the config's ``inference.batch_size``, at most N).
    full_batch : bool
        Conjugate models: every step the whole training set; ρ = 1 for ``none``,
        ``deterministic`` and ``stochastic`` (seed 002's batch algorithms), the schedule's ρ_t for
        ``svi+`` (seed 000 §IV-A).
    tau0, kappa : float, optional
        Robbins-Monro ρ_t = (τ0 + t)^−κ (default: the config's).
    seed : int
        Start i of every method is the engine's ``init(train, seed + 1000 i + 1)``.
    trace : bool
        Record ``(seconds, ELBO/record)`` at :data:`SEGMENTS` + 1 points of the first start's fit
        of every method (for :func:`plot_traces`; the evaluations are not timed; the other
        starts' ``traces`` are empty).
    progress : callable, optional
        Called with one line of text per finished start.
    """
    say = progress or (lambda msg: None)
    gradient = _is_gradient(model)
    mk = cfg["model"]["kind"]
    if inits < 1:
        raise ValueError(f"--inits must be >= 1, got {inits}")
    if not (isinstance(epochs, (int, float)) and epochs > 0):
        raise ValueError(f"--epochs must be > 0, got {epochs}")
    annealers, estimators = check_methods(mk, annealers=annealers, estimators=estimators, m=m,
                                          full_batch=full_batch)
    N = kind.n_records(train)
    if N < 2:
        raise ValueError(f"{N} training record: too few to compare methods on")
    S = int(batch_size if batch_size is not None else cfg["inference"]["batch_size"])
    if S < 1:
        raise ValueError(f"--batch-size must be >= 1, got {S}")
    S = min(S, N)
    sched, sched_text = _schedule(cfg["inference"], tau0, kappa)
    if gradient:
        methods = _gradient_methods(cfg, model, N, S, estimators, sched)
        eps = np.random.default_rng(seed + 7).standard_normal((GRADIENT_ELBO_DRAWS, model.n_params))
    else:
        methods = _conjugate_methods(cfg, model, N, S, annealers, m, full_batch, sched)
        eps = None
    tr_eps = None if eps is None else eps[:TRACE_DRAWS]
    steps = max(1, int(epochs)) if full_batch else max(1, int(round(epochs * N / S)))
    ho_name, _ = HELD_OUT.get(kind.name, ("held-out lp/record", "records"))
    units = _units(kind, held_out) if held_out is not None else None
    cut = np.unique(np.linspace(0, steps, min(SEGMENTS, steps) + 1).round().astype(int))
    for label, engine, _ in ([] if gradient else methods):
        late = _still_annealing(engine.annealing, steps)
        if late:
            say(f"note: {label}: {late}; its final q is still annealed (give more --epochs, or a shorter "
                f"schedule in the config's [inference.annealing])")
    rows = []
    for label, engine, batch in methods:
        row = MethodRow(label)
        for i in range(inits):
            state = engine.init(train, seed=seed + 1000 * i + 1)
            secs, tr = 0.0, []
            traced = trace and i == 0
            if traced:
                tr.append((0.0, _elbo(engine, state, train, tr_eps) / N))
            for a, b in zip(cut[:-1], cut[1:]):
                t0 = time.perf_counter()
                state, _ = engine.fit(state, train, n_steps=int(b - a), batch_size=batch)
                secs += time.perf_counter() - t0
                if traced:
                    tr.append((secs, _elbo(engine, state, train, tr_eps) / N))
            row.seconds.append(secs)
            row.traces.append(tr)
            row.elbo.append(_elbo(engine, state, train, eps) / N)
            if held_out is not None:
                row.held_out.append(float(np.sum(engine.predictive_logpdf(state, held_out))) / units)
            say(f"  {label:<18} start {i + 1}/{inits}: ELBO/record {row.elbo[-1]:.5g}"
                + (f", {ho_name} {row.held_out[-1]:.5g}" if held_out is not None else "")
                + f" ({secs:.1f} s)")
        rows.append(row)
    ref = np.asarray(rows[0].elbo)
    for row in rows[1:]:
        d = np.asarray(row.elbo) - ref
        tol = TIE_RTOL * np.maximum(np.abs(ref), 1e-12)
        row.wins, row.losses = int(np.sum(d > tol)), int(np.sum(d < -tol))
        row.ties = inits - row.wins - row.losses
        row.sign_p = sign_test(row.wins, row.losses)
    settings = (f"|S|={S}, {steps} steps" + (" (full batch)" if full_batch else f" ({epochs:g} epochs)")
                + f", {sched_text}")
    return Comparison(rows=rows, model_kind=mk, what=what, n_train=N,
                      n_held_out=0 if held_out is None else kind.n_records(held_out),
                      held_out_name=ho_name, settings=settings, inits=inits)


def compare(config, data, *, held_out: float = 0.1, fmt: str | None = None, seed: int = 0,
            **kw) -> Comparison:
    """The library entry of ``streamsvi compare --config FILE --data RECORDS``.

    ``config``: a TOML file or a validated config dict; ``data``: the records file
    (:func:`read_records_file`, ``fmt``); ``held_out``: the fraction held out, drawn with
    ``seed``. The other keywords are :func:`compare_methods`'.

    Examples
    --------
    >>> import tempfile, os
    >>> from streamsvi.service.config import validate
    >>> cfg = validate({"model": {"kind": "gauss1d", "n_components": 2},
    ...                 "inference": {"n_total": 100, "batch_size": 20}, "source": {"topics": ["t"]},
    ...                 "checkpoint": {"directory": "unused"}})
    >>> rng = np.random.default_rng(0)
    >>> path = os.path.join(tempfile.mkdtemp(), "x.jsonl")
    >>> with open(path, "w") as f:
    ...     _ = f.write("".join(f"[{v}]\\n" for v in np.r_[rng.normal(-3, 1, 50), rng.normal(3, 1, 50)]))
    >>> res = compare(cfg, path, inits=2, epochs=2, annealers=["none", "svi+"])
    >>> [r.label for r in res.rows], res.n_train, res.n_held_out
    (['none', 'svi+ M=5'], 90, 10)
    >>> res.rows[1].wins + res.rows[1].ties + res.rows[1].losses
    2
    """
    from .service.config import load_config

    cfg = config if isinstance(config, dict) else load_config(config)
    model, kind, recs = read_records_file(cfg, data, fmt)
    train, test = split_held_out(kind, recs.part, held_out, seed)
    return compare_methods(cfg, model, kind, train, test, seed=seed, what=recs.what, **kw)


# ---------------------------------------------------------------------- output

def format_table(res: Comparison) -> str:
    """The table ``streamsvi compare --config`` prints."""
    ho = res.held_out_name
    head = (f"{'method':<18} {'ELBO/rec mean':>14} {'± sd':>9} {'best':>11} {ho + ' mean':>24} "
            f"{'s/run':>8} {'W/T/L vs ' + res.rows[0].label:>18} {'sign p':>7}")
    lines = [head, "-" * len(head)]
    for k, r in enumerate(res.rows):
        e = np.asarray(r.elbo)
        sd = float(e.std(ddof=1)) if len(e) > 1 else 0.0
        h = f"{np.mean(r.held_out):24.5g}" if r.held_out else f"{'-':>24}"
        wtl = "(reference)" if k == 0 else f"{r.wins}/{r.ties}/{r.losses}"
        p = "" if k == 0 else f"{r.sign_p:.3g}"
        lines.append(f"{r.label:<18} {e.mean():14.6g} {sd:9.3g} {e.max():11.6g} {h} {np.mean(r.seconds):8.2f} "
                     f"{wtl:>18} {p:>7}")
    return "\n".join(lines)


def plot_traces(res: Comparison, path) -> None:
    """Draw ELBO/record against fit time of the first start, one line per method (PNG).

    Needs matplotlib (``pip install 'streamsvi[report]'``); ``ImportError`` saying so otherwise."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib: pip install 'streamsvi[report]' (or pip install "
                          "matplotlib)") from None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    traces = [(k, r, tr) for k, r in enumerate(res.rows) for tr in r.traces if tr]
    # a method that ends below its start would flatten the others: the axis stops at the lowest
    # start or final value of the methods that improved, and the label says so
    kept = [v for _, _, tr in traces for v in (tr[0][1], tr[-1][1]) if tr[-1][1] >= tr[0][1]]
    for k, r, tr in traces:
        t, v = zip(*tr)
        below = bool(kept) and tr[-1][1] < tr[0][1]
        ax.plot(t, v, color=f"C{k % 10}", alpha=0.8, lw=1.2,
                label=r.label + (" (ends below its start)" if below else ""))
    if kept and len(kept) < 2 * len(traces):
        lo, hi = min(kept), max(v for _, _, tr in traces for _, v in tr)
        ax.set_ylim(lo - 0.05 * (hi - lo + 1e-12), hi + 0.05 * (hi - lo + 1e-12))
    ax.set_xlabel("fit time (s)")
    ax.set_ylabel("ELBO per training record")
    ax.set_title(f"{res.model_kind}: {res.n_train} training records, start 1 of {res.inits}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
