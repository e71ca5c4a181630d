"""Prometheus metrics of the daemon, declared once (STYLE.md §10).

Namespace ``streamsvi``; base units in names; an injectable
``CollectorRegistry`` so tests read values back. Values that describe the
latest update (ELBO, ρ, step, …) are gauges set after every update.

A gauge with no value yet is absent, not 0: the update gauges (ELBO, ρ,
gradient norm and variances, SVI+ noise, M) before this process's first
update, the held-out log-likelihood before the reservoir is first scored
(also after a resume), the last checkpoint time before any checkpoint. Such
a :class:`LatestValue` is exposed as its ``# HELP`` / ``# TYPE`` lines with
no sample, so a query or an alert (``streamsvi_elbo != streamsvi_elbo``)
sees no series instead of a made-up 0 or NaN.

Gradient variance, two views:

* ``streamsvi_gradient_variance_estimate`` — from one batch:
  N² tr(Σ̂_t)/M_eff, Σ̂_t the sample covariance of the records' expected
  sufficient statistics (docs/design.md, "Metrics defined").
* ``streamsvi_gradient_variance_observed`` — across steps: an exponentially
  weighted mean (river ``stats.EWMean``) of ½‖ĝ_t − ĝ_{t−1}‖², the successive-
  difference (von Neumann) estimator of tr Var(ĝ), which a slowly moving mean
  of ĝ does not inflate. When q is near a fixed point the two should agree.
"""
from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from river import stats as river_stats

_LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)


class LatestValue:
    """A gauge without labels that is absent until it is first set.

    ``set(v)`` as a prometheus_client ``Gauge``; ``value`` is None before
    that. At scrape time it yields its metric family with one sample, or with
    none while it has no value (the family still appears in
    ``registry.collect()``, so the metric stays discoverable).
    """

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry):
        self.name, self.documentation = name, documentation
        self.value: float | None = None
        registry.register(self)

    def set(self, value: float) -> None:
        self.value = float(value)        # one reference assignment: atomic for the scrape thread

    def clear(self) -> None:
        """Back to no value (absent from the exposition)."""
        self.value = None

    def describe(self):
        return [GaugeMetricFamily(self.name, self.documentation)]

    def collect(self):
        family = GaugeMetricFamily(self.name, self.documentation)
        value = self.value
        if value is not None:
            family.add_metric([], value)
        return [family]


class SlowPathFetches:
    """``streamsvi_slow_path_fetches_total{reason}``: fetches this process handed to
    kafka-python's own record parser instead of the lean reader, read at scrape time
    from :func:`streamsvi.io._fastfetch.slow_path_counts` (process-wide, one series per
    reason in ``SLOW_PATH_REASONS``, 0 included; ``no_hook`` counts consumers whose
    kafka-python had no hook, every fetch of which is slow). ``read`` replaces that
    function in tests.
    """

    name = "streamsvi_slow_path_fetches"
    _labelnames = ("reason",)            # as prometheus_client's metrics (docs/gen_reference.py)
    documentation = ("Fetches read by kafka-python's per-record parser instead of the lean "
                     "reader, by reason (no_hook: consumers whose kafka-python has no hook)")

    def __init__(self, registry: CollectorRegistry, read=None):
        self._read = read
        registry.register(self)

    def describe(self):
        return [CounterMetricFamily(self.name, self.documentation, labels=self._labelnames)]

    def collect(self):
        if self._read is None:
            from ..io._fastfetch import slow_path_counts   # at scrape time: no import at start-up
            self._read = slow_path_counts
        family = CounterMetricFamily(self.name, self.documentation, labels=self._labelnames)
        for reason, n in sorted(self._read().items()):
            family.add_metric([reason], n)
        return [family]


class MetricsServeError(ValueError):
    """The metrics endpoint could not listen on ``metrics.host:metrics.port``.

    A ``ValueError``: the CLI prints it as one line and exits with
    ``exitcodes.USAGE`` (2), as for any setting the user has to change. The
    message says which setting (``metrics.port`` for a port in use or refused,
    ``metrics.host`` for an address that is not this machine's) and what to
    set instead.

    Attributes
    ----------
    host : str
        ``metrics.host``.
    port : int
        ``metrics.port``.
    cause : OSError
        What ``bind`` (or the host name's lookup) raised.
    """

    def __init__(self, host: str, port: int, cause: OSError):
        self.host, self.port, self.cause = host, int(port), cause
        super().__init__(self._message())

    def _message(self) -> str:
        import errno
        import socket

        where, err = f"{self.host}:{self.port}", self.cause
        why = err.strerror or str(err)
        if err.errno == errno.EADDRINUSE:
            return (f"metrics.port: cannot serve metrics on {where}: the port is in use (another "
                    f"process listens there, such as another streamsvi daemon); set metrics.port to "
                    f"a free port, or to 0 for any free port")
        if err.errno == errno.EACCES:
            return (f"metrics.port: cannot serve metrics on {where}: {why} (ports below 1024 need "
                    f"privileges); set metrics.port to a free port above 1023, or to 0 for any free "
                    f"port")
        if isinstance(err, socket.gaierror) or err.errno == errno.EADDRNOTAVAIL:
            return (f"metrics.host: cannot serve metrics on {where}: {why} ({self.host!r} is not an "
                    f"address of this machine); set metrics.host to one of its addresses, such as "
                    f"127.0.0.1 (this machine only) or 0.0.0.0 (every interface)")
        return (f"metrics.port: cannot serve metrics on {where}: {why}; set metrics.host and "
                f"metrics.port to an address and a free port of this machine (metrics.port = 0: any "
                f"free port)")


class DaemonMetrics:
    """All metrics of one daemon, registered in ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None, fading_factor: float = 0.1):
        self.registry = registry if registry is not None else CollectorRegistry()
        ns, r = "streamsvi", self.registry
        g = lambda name, doc, labels=(): Gauge(name, doc, labels, namespace=ns, registry=r)  # noqa: E731
        latest = lambda name, doc: LatestValue(f"{ns}_{name}", doc, r)  # noqa: E731
        c = lambda name, doc, labels=(): Counter(name, doc, labels, namespace=ns, registry=r)  # noqa: E731
        self.elbo = latest("elbo", "Minibatch ELBO estimate L_t (nats) at the parameters before the latest update")
        self.elbo_per_record = latest("elbo_per_record", "Minibatch ELBO estimate divided by N (nats per record)")
        self.heldout_loglik = latest("heldout_loglik_per_record",
                                "Mean log posterior-predictive density of the held-out reservoir (nats per record)")
        self.heldout_records = g("heldout_records", "Records in the held-out reservoir")
        # classifiers (models with predict_proba, e.g. logistic): scored with the held-out log-likelihood
        self.heldout_log_loss = latest("heldout_log_loss",
                                       "Mean -log p(y|x, data) of the held-out labelled records (nats)")
        self.heldout_accuracy = latest("heldout_accuracy",
                                       "Fraction of held-out labelled records whose most probable class is the label")
        # prequential evaluation (metrics.evaluation = "prequential"): each minibatch scored before it is learned
        self.prequential_loglik = latest("prequential_loglik_per_record",
                                         "Mean log predictive density of the latest minibatch's scored sample "
                                         "at the parameters before it was learned (nats per record)")
        self.prequential_smoothed = latest("prequential_loglik_smoothed",
                                           "Exponentially weighted mean (fading factor "
                                           "metrics.prequential_fading) of the prequential log predictive "
                                           "density per record, weighted by records")
        self.prequential_records = c("prequential_records", "Records scored by the prequential evaluation")
        self.prequential_log_loss = latest("prequential_log_loss",
                                           "Classifiers: mean -log p(y|x) of the latest minibatch's sample before "
                                           "it was learned (nats)")
        self.prequential_accuracy = latest("prequential_accuracy",
                                           "Classifiers: accuracy on the latest minibatch's sample before it was "
                                           "learned")
        # promotion ([promotion]): the snapshot scorers follow
        self.promoted_snapshot = latest("promoted_snapshot", "Number of the promoted snapshot (the one "
                                        "streamsvi.load and SnapshotWatcher follow)")
        self.promoted_loglik = latest("promoted_loglik_per_record", "Held-out log predictive density of the "
                                      "promoted snapshot when it was promoted (nats per record)")
        self.promotion_decisions = c("promotion_decisions", "Promotion decisions, by outcome (promoted, "
                                     "rejected, superseded)", ("outcome",))
        self._preq_sum, self._preq_weight = 0.0, 0.0
        # the gradient path: the batch gradient-variance estimate, labelled by the estimator that made it
        self.grad_var_by_estimator = g("gradient_variance_by_estimator",
                                       "N^2 tr(Sigma_t)/|S| of the latest stochastic ELBO gradient, by "
                                       "estimator (legrad, regrad, ldgrad; gradient path only)", ("estimator",))
        self.grad_var_est = latest("gradient_variance_estimate",
                              "N^2 tr(Sigma_t)/M_eff: estimated total variance of the natural gradient from one batch")
        self.grad_var_obs = latest("gradient_variance_observed",
                              "EW mean of 0.5*||g_t - g_(t-1)||^2: observed step-to-step variance of the natural gradient")
        self.grad_norm = latest("gradient_norm", "Euclidean norm of the latest natural gradient")
        self.rho = latest("step_size", "Step size rho_t of the latest update")
        self.noise_std = latest("svi_plus_noise_std", "Standard deviation sqrt(|S|/M - 1) of the SVI+ noise eps_n")
        self.effective_batch = latest("effective_batch_size", "SVI+ effective batch size M of the latest update")
        self.annealing_level = g("annealing_level",
                                 "Level of the annealer (label kind) at the latest update: svi+ = SVI+ noise "
                                 "std sqrt(|S|/M_t - 1), deterministic = temperature T_t (1 = untempered), "
                                 "stochastic = weight rho_t of the random restart, none = 0", ("kind",))
        self.step = g("step", "Updates applied to the parameters (engine step t)")
        self.records_seen = g("records_seen", "Records folded into the parameters (engine state)")
        self.records = c("records_consumed", "Records that reached the model")
        self.dead = c("records_dead_lettered", "Records set aside, by reason", ("reason",))
        self.batches = c("batches", "Minibatches applied")
        self.domain_clipped = c("domain_clipped_blocks",
                                "Parameter blocks whose step was shortened to keep lambda in its domain")
        self.domain_updates = c("domain_clipped_updates", "Updates in which at least one block was shortened")
        self.update_seconds = Histogram("update_duration_seconds", "Wall time of one engine update",
                                        namespace=ns, registry=r, buckets=_LATENCY_BUCKETS)
        self.lag = g("consumer_lag_records", "Highwater mark minus position, per partition",
                     ("topic", "partition"))
        self.checkpoint_ts = latest("last_checkpoint_timestamp_seconds",
                               "Unix time of the last durable checkpoint")
        self.checkpoints = c("checkpoints", "Durable checkpoints written")
        self.broker_up = g("broker_up", "1 when the last broker call succeeded, 0 while retrying")
        self.broker_retries = c("broker_retries", "Retries after the broker was unavailable")
        self.offset_resets = c("offset_resets", "Times the consumer went back to the earliest offset "
                               "because the expected one was past the end of the log", ("topic", "partition"))
        self.slow_path_fetches = SlowPathFetches(r)
        self.consumers_replaced = c("consumers_replaced", "Kafka consumers replaced by a new member of "
                                    "their group after a poll that never returned (streamsvi.io.callguard)")
        # drift that the learner answers (streamsvi.service.drift)
        self.drift_detected = c("drift_detected", "Changes the drift detector found in the prequential "
                                "log predictive density, by detector and the response applied",
                                ("detector", "response"))
        self.drift_active = g("drift_response_active", "1 while a drift response (a rho floor or a "
                              "re-annealing) is in force, else 0")
        self.drift_last_step = latest("drift_last_detection_step",
                                      "Engine step of the batch at which drift was last detected")
        self._ewm = river_stats.EWMean(fading_factor=fading_factor)
        self._prev_grad = None
        #: The value behind ``streamsvi_gradient_variance_observed`` (None before two updates).
        self.observed_variance = None

    def observe_update(self, info, gradient=None, seconds: float | None = None,
                       annealing_kind: str | None = None) -> None:
        """Record one engine update (``UpdateInfo``) and optionally its gradient ĝ_t (NatParams).

        ``annealing_kind`` (the engine's ``annealing.kind``) labels
        ``streamsvi_annealing_level``; without it that gauge is not set.
        """
        if annealing_kind is not None:
            self.annealing_level.labels(kind=annealing_kind).set(info.annealing_level)
        self.elbo.set(info.elbo)
        self.elbo_per_record.set(info.elbo_per_record)
        self.grad_var_est.set(info.grad_variance)
        self.grad_norm.set(info.grad_norm)
        self.rho.set(info.rho)
        self.noise_std.set(info.noise_std)
        self.effective_batch.set(info.effective_batch_size)
        self.step.set(info.step)
        self.records.inc(info.batch_size)
        self.batches.inc()
        if info.domain_clipped:
            self.domain_clipped.inc(info.domain_clipped)
            self.domain_updates.inc()
        if seconds is not None:
            self.update_seconds.observe(seconds)
        if gradient is not None:
            if self._prev_grad is not None:
                self._ewm.update(0.5 * (gradient - self._prev_grad).sqnorm())
                self.observed_variance = self._ewm.get()
                self.grad_var_obs.set(self.observed_variance)
            self._prev_grad = gradient

    def observe_drift(self, monitor, event=None) -> None:
        """After :meth:`DriftMonitor.observe <streamsvi.service.drift.DriftMonitor.observe>`:
        the response gauge, and the counter and step of ``event`` when one was returned."""
        self.drift_active.set(1.0 if monitor.active else 0.0)
        if event is not None:
            self.drift_detected.labels(detector=event.detector, response=event.response).inc()
            self.drift_last_step.set(event.step)

    def observe_prequential(self, mean: float, n: int, fading: float = 0.001) -> float:
        """One minibatch's prequential figure (mean over ``n`` scored records): sets the latest
        and the smoothed gauges and returns the smoothed value, an exponentially weighted mean
        with weight ``1 - (1 - fading)^n`` on the new batch (so it fades per record, not per batch)."""
        self.prequential_loglik.set(mean)
        self.prequential_records.inc(n)
        if not np.isfinite(mean) or n <= 0:        # a batch the model cannot score: not smoothed in
            return self.prequential_smoothed.value
        decay = (1.0 - fading) ** n
        self._preq_sum = decay * self._preq_sum + (1.0 - decay) * mean
        self._preq_weight = decay * self._preq_weight + (1.0 - decay)
        smoothed = self._preq_sum / self._preq_weight
        self.prequential_smoothed.set(smoothed)
        return smoothed

    def observe_dead(self, reason: str, n: int = 1) -> None:
        self.dead.labels(reason=reason).inc(n)

    def set_lag(self, lags: dict) -> None:
        for (topic, partition), v in lags.items():
            self.lag.labels(topic=str(topic), partition=str(partition)).set(v)

    def serve(self, port: int, addr: str = "127.0.0.1", poll_interval: float = 0.05):
        """Serve ``/metrics`` over HTTP in a daemon thread; returns (server, thread).

        Like ``prometheus_client.start_http_server`` but with a short
        ``serve_forever`` poll interval, so ``server.shutdown()`` at the end of
        a run returns within ~50 ms instead of up to 0.5 s.

        Raises
        ------
        MetricsServeError
            If ``addr:port`` cannot be bound (a port in use, a host that is not
            an address of this machine); its message names the setting to change.
        """
        import socketserver
        import threading
        from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

        class _Server(socketserver.ThreadingMixIn, WSGIServer):
            daemon_threads = True

        class _Quiet(WSGIRequestHandler):
            def log_message(self, *args):   # no access log on stderr
                pass

        try:
            httpd = make_server(addr, port, make_wsgi_app(self.registry), _Server, handler_class=_Quiet)
        except OSError as exc:
            raise MetricsServeError(addr, port, exc) from None
        thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": poll_interval},
                                  name="streamsvi-metrics", daemon=True)
        thread.start()
        return httpd, thread


class ScaleoutMetrics:
    """Metrics of the scale-out roles (``--role worker|applier``), in the daemon's registry.

    Applier: ``streamsvi_delta_staleness{worker}`` (λ versions between the λ a
    delta was computed at and the λ it was applied to, latest per worker),
    ``streamsvi_deltas_applied_total{worker}``, ``streamsvi_delta_records_total{worker}``
    (records in applied deltas: per-worker throughput), ``streamsvi_deltas_skipped_total{reason}``
    (duplicate, aborted, overlap, stale, no_state, bad, non_finite), ``streamsvi_applier_active`` (1 while this
    applier owns the deltas partition). Both roles: ``streamsvi_lambda_version`` (the λ
    version this process published or computes at). Worker: ``streamsvi_deltas_sent_total``,
    ``streamsvi_worker_transactions_total`` (committed transactions; each carries up to
    ``scaleout.commit_every_batches`` deltas),
    ``streamsvi_deltas_withheld_total`` (batches read again instead of committed, because the
    group had moved on: the member was dropped or the partition handed on). Applier:
    ``streamsvi_delta_gaps_total`` (deltas that start past the end of the ranges applied for a
    partition: records that no delta carries; never expected).
    """

    def __init__(self, registry: CollectorRegistry):
        ns, r = "streamsvi", registry
        self.staleness = Gauge("delta_staleness", "Lambda versions between the lambda a delta was "
                               "computed at and the lambda it was applied to (latest, per worker)",
                               ("worker",), namespace=ns, registry=r)
        self.applied = Counter("deltas_applied", "Deltas applied to lambda, per worker", ("worker",),
                               namespace=ns, registry=r)
        self.delta_records = Counter("delta_records", "Records in applied deltas, per worker",
                                     ("worker",), namespace=ns, registry=r)
        self.skipped = Counter("deltas_skipped", "Deltas not applied, by reason", ("reason",),
                               namespace=ns, registry=r)
        self.active = Gauge("applier_active", "1 while this applier owns the deltas partition",
                            namespace=ns, registry=r)
        self.lambda_version = Gauge("lambda_version", "Lambda version this process published "
                                    "(applier) or computes deltas at (worker)", namespace=ns, registry=r)
        self.deltas_sent = Counter("deltas_sent", "Deltas this worker committed to the deltas topic",
                                   namespace=ns, registry=r)
        self.transactions = Counter("worker_transactions", "Transactions this worker committed (each "
                                    "holds one or more deltas and their batches' offsets)",
                                    namespace=ns, registry=r)
        self.withheld = Counter("deltas_withheld", "Batches this worker read again instead of "
                                "committing them, because it was no longer a stable member owning "
                                "their partitions", namespace=ns, registry=r)
        self.gaps = Counter("delta_gaps", "Deltas that start past the end of the applied ranges of "
                            "a partition (records no delta carries)", namespace=ns, registry=r)


class ScorerMetrics:
    """Metrics of the scorer role (``--role scorer``), in the daemon's registry.

    ``streamsvi_records_scored_total`` (records/s is its rate),
    ``streamsvi_scoring_duration_seconds`` (wall time of scoring one batch: decode done,
    the model's ``score`` and the output records made),
    ``streamsvi_scorer_errors_total{reason}`` (input records answered with an error, by
    the daemon's reason code), ``streamsvi_scorer_snapshot_number`` and
    ``streamsvi_scorer_snapshot_step`` (the snapshot scoring now),
    ``streamsvi_scorer_snapshot_age_seconds`` (seconds since that snapshot was written,
    computed at scrape time), ``streamsvi_scorer_snapshot_swaps_total`` and
    ``streamsvi_scorer_transactions_total``.
    """

    def __init__(self, registry: CollectorRegistry):
        import time

        ns, r = "streamsvi", registry
        self.scored = Counter("records_scored", "Input records answered with their scores (records/s: its rate)",
                              namespace=ns, registry=r)
        self.seconds = Histogram("scoring_duration_seconds", "Wall time of scoring one batch (the model's "
                                 "score and the output records)", namespace=ns, registry=r,
                                 buckets=_LATENCY_BUCKETS)
        self.errors = Counter("scorer_errors", "Input records answered with an error record, by reason",
                              ("reason",), namespace=ns, registry=r)
        self.snapshot_number = Gauge("scorer_snapshot_number", "Number of the snapshot the scorer scores with",
                                     namespace=ns, registry=r)
        self.snapshot_step = Gauge("scorer_snapshot_step", "Engine step of the snapshot the scorer scores with",
                                   namespace=ns, registry=r)
        self.snapshot_created = None          # Unix time the snapshot in use was written
        self.snapshot_age = Gauge("scorer_snapshot_age_seconds", "Seconds since the snapshot the scorer "
                                  "scores with was written", namespace=ns, registry=r)
        self.snapshot_age.set_function(lambda: float("nan") if self.snapshot_created is None
                                       else time.time() - self.snapshot_created)
        self.swaps = Counter("scorer_snapshot_swaps", "Snapshots swapped in while scoring", namespace=ns,
                             registry=r)
        self.transactions = Counter("scorer_transactions", "Transactions the scorer committed (scored "
                                    "records and input offsets together)", namespace=ns, registry=r)

    def use_snapshot(self, fitted) -> None:
        """The scorer scores with ``fitted`` (a :class:`~streamsvi.scoring.FittedModel`) from now on."""
        self.snapshot_number.set(fitted.number)
        self.snapshot_step.set(fitted.step)
        self.snapshot_created = fitted.created.timestamp()
