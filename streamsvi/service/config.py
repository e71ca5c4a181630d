"""Daemon configuration: a TOML file, validated up front.

Every setting, its type, default and meaning is in :data:`SCHEMA`; errors
name the field (``source.topics: expected a list of strings, got 3``).
``streamsvi run --config FILE --print-config`` shows the resolved config.
See ``configs/`` for one example per model.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import ssl
import tomllib
from dataclasses import dataclass
from pathlib import Path

# The models (streamsvi.models.CONFIG_KINDS, GradientModel) and streamsvi.settings (numpy)
# are imported by the functions that use them: source_settings() reads the [source] table
# without them, so that `streamsvi run` starts its group join before it imports numpy.


def did_you_mean(*args, **kwargs) -> str:
    """:func:`streamsvi.settings.did_you_mean`, imported when first needed."""
    from ..settings import did_you_mean as _did_you_mean
    return _did_you_mean(*args, **kwargs)


def _config_kinds() -> dict:
    from ..models import CONFIG_KINDS
    return CONFIG_KINDS


def _gradient_model():
    from ..models.base import GradientModel
    return GradientModel


REQUIRED = object()

log = logging.getLogger(__name__)

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True)
class Field:
    type: str          # "int", "float", "str", "bool", "list[str]", "list[float]", "float|auto", "dict"
    default: object
    doc: str
    choices: tuple = ()
    min: float | None = None
    max: float | None = None


#: section -> field -> Field. "model" fields beyond ``kind`` are the model's own settings.
SCHEMA: dict[str, dict[str, Field]] = {
    # [model]: ``kind`` and the settings table of the class it names (streamsvi.models.CONFIG_KINDS;
    # model_schema); [records]: the settings table of that model's record kind (records_schema)
    "model": {
        "kind": Field("str", REQUIRED, "the model (streamsvi.models.CONFIG_KINDS); its settings are "
                      "the settings table of its class (model_schema)"),
    },
    "inference": {
        "n_total": Field("float|auto", REQUIRED, "N: data-set size, or population size alpha for an "
                         "unbounded stream; 'auto' = sum of the topics' highwater marks at start", min=0),
        "batch_size": Field("int", 1000, "|S|: records per minibatch", min=1),
        "max_wait_seconds": Field("float", 1.0, "apply a smaller batch after waiting this long", min=0),
        "effective_batch_size": Field("float", None, "M for SVI+ (0 < M <= batch_size); unset = SVI", min=0),
        "effective_fraction": Field("float", None, "M as a fraction of each batch (instead of M)",
                                    min=0, max=1),
        "schedule": Field("str", "robbins_monro", "robbins_monro or constant",
                          choices=("robbins_monro", "constant")),
        "tau0": Field("float", 1.0, "Robbins-Monro delay tau0 >= 0", min=0),
        "kappa": Field("float", 0.7, "Robbins-Monro forgetting rate kappa in (0.5, 1]"),
        "rho_min": Field("float", None, "floor on rho_t for drifting streams (leaves Robbins-Monro)",
                         min=0, max=1),
        "rho": Field("float", 0.1, "step size for schedule = constant", min=0, max=1),
        "boundary_fraction": Field("float", 0.9, "fraction-to-boundary for steps that would leave "
                                   "the parameter domain", min=0, max=1),
        "seed": Field("int", 0, "seed of the random stream (initialisation, SVI+ noise)"),
        "annealing": Field("dict", None, "[inference.annealing] table: kind = none, svi+, "
                           "deterministic or stochastic, and its schedule settings (ANNEALING)"),
        # the gradient path (model.kind = logistic, softmax; streamsvi.inference.gradients)
        "estimator": Field("str", None, "logistic, softmax: stochastic ELBO gradient, legrad (local expectation "
                           "gradients, default), regrad (reparameterisation) or ldgrad (score function)",
                           choices=("legrad", "regrad", "ldgrad")),
        "n_samples": Field("int", None, "logistic, softmax: pivots (legrad) or samples (regrad, ldgrad) per "
                           "update; default 1, 1 and P*K", min=1),
        "quadrature_points": Field("int", None, "logistic, softmax: K, Gauss-Hermite nodes of legrad; default 5",
                                   min=2),
        "optimizer": Field("str", None, "logistic, softmax: natural (natural-gradient Robbins-Monro steps, "
                           "default), sgd (plain Robbins-Monro steps on the gradient / N) or adam "
                           "(Adam with step learning_rate * rho_t)", choices=("natural", "sgd", "adam")),
        "learning_rate": Field("float", None, "logistic, softmax: multiplies rho_t; default 1 (natural, sgd), "
                               "0.01 (adam)", min=0),
        "covariance": Field("str", None, "logistic, softmax: covariance of q over the weights, diagonal "
                            "(mean field, default), full (at most 1000 weights) or lowrank "
                            "(diag + B B^T, needs rank)", choices=("diagonal", "full", "lowrank")),
        "rank": Field("int", None, "logistic, softmax: columns of B for covariance = lowrank", min=1),
        "kl": Field("str", None, "logistic, softmax: sampled (seed 001's f = log p(y, w) - log q(w) sampled "
                    "as a whole) or exact (the KL term and its gradient in closed form, only the "
                    "log-likelihood sampled); default sampled for legrad, exact for regrad and ldgrad",
                    choices=("sampled", "exact")),
    },
    "source": {
        "kind": Field("str", "kafka", "kafka or file", choices=("kafka", "file")),
        "bootstrap_servers": Field("str", "127.0.0.1:9092", "Kafka bootstrap servers, comma separated"),
        "topics": Field("list[str]", None, "topics to consume (or pattern)"),
        "pattern": Field("str", None, "regex of topics to consume (instead of topics)"),
        "group_id": Field("str", "streamsvi", "consumer group"),
        "codec": Field("str", "json", "json (one record per message) or binary (one minibatch per "
                       "message); lda also: text (raw text per message)", choices=("json", "binary", "text")),
        "vocabulary": Field("str", None, "text codec (lda): vocabulary file, one word per line (line i = "
                            "word id i); unset = the hashing trick into n_features buckets"),
        "fields": Field("list[str]", None, "for JSON objects: the field names, in feature order"),
        "dead_letter_topic": Field("str", None, "Kafka topic for records that fail decoding or validation"),
        "prefetch": Field("bool", False, "read and decode the next minibatch in a background thread while "
                          "the model learns the last one (one batch ahead; offsets are committed only "
                          "for what a checkpoint holds, as without it). Off by default: on 2 cores it "
                          "gained nothing (bench/e2e_throughput.py)"),
        "path": Field("str", None, "file source: JSONL or CSV file"),
        "format": Field("str", "jsonl", "file source format: jsonl or csv", choices=("jsonl", "csv")),
        "dead_letter_path": Field("str", None, "file for dead letters (file source, or Kafka without a "
                                  "dead-letter topic); default: <checkpoint directory>/dead-letters.jsonl"),
        "session_timeout_ms": Field("int", 2000, "consumer group session timeout; a real Kafka cluster "
                                    "needs >= its group.min.session.timeout.ms (6000 by default): use "
                                    "10000 there. The local broker joins in about half this time", min=1),
        "heartbeat_interval_ms": Field("int", 500, "consumer heartbeat interval (< session timeout / 3)",
                                       min=1),
        "connect_attempts": Field("int", 30, "broker connection attempts at start before giving up", min=1),
        "connect_backoff_seconds": Field("float", 1.0, "initial retry backoff (doubles, max 30 s)", min=0),
        "assignment_timeout_seconds": Field("float", None, "how long the daemon or a worker waits at start "
                                            "for its group to assign it partitions (for a topic to "
                                            "appear, a rebalance to complete) before exit code 6; "
                                            "unset = 60", min=1),
        # Security of every Kafka client streamsvi makes (consumer, dead-letter producer,
        # highwater probes, `streamsvi produce`); see client_security.
        "security_protocol": Field("str", "PLAINTEXT", "PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
                                   "SASL_SSL (SASL over TLS)", choices=SECURITY_PROTOCOLS),
        "sasl_mechanism": Field("str", None, "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 "
                                "(SASL_* protocols)", choices=SASL_MECHANISMS),
        "sasl_username": Field("str", None, "SASL user name (SASL_* protocols)"),
        "sasl_password_env": Field("str", None, "name of the environment variable holding the SASL "
                                   "password (or sasl_password_file; never the password itself)"),
        "sasl_password_file": Field("str", None, "file holding the SASL password (one line)"),
        "ssl_cafile": Field("str", None, "PEM file of the CA(s) that signed the brokers' certificates "
                            "(SSL, SASL_SSL); unset = the system's CAs"),
        "ssl_certfile": Field("str", None, "PEM client certificate, for brokers that require one "
                              "(may hold the key too)"),
        "ssl_keyfile": Field("str", None, "PEM private key of ssl_certfile"),
        "ssl_password_env": Field("str", None, "environment variable holding the password of an "
                                  "encrypted ssl_keyfile"),
        "ssl_password_file": Field("str", None, "file holding the password of an encrypted ssl_keyfile"),
        "ssl_check_hostname": Field("bool", True, "check that a broker's certificate names the host "
                                    "connected to (as advertised by the cluster)"),
    },
    "validation": {
        "max_abs": Field("float", 1e12, "largest absolute value accepted in a record (lda: the "
                         "largest word count)", min=0),
        "max_message_bytes": Field("int", 1_048_576, "largest accepted message (JSON codec)", min=1),
        "max_sequence_length": Field("int", 100_000, "longest accepted sequence (hmm records)", min=1),
        "min_rating": Field("float", None, "pmf: ratings below this are dead-lettered (out_of_range)"),
        "max_rating": Field("float", None, "pmf: ratings above this are dead-lettered (out_of_range)"),
    },
    "checkpoint": {
        "directory": Field("str", REQUIRED, "where snapshots are written"),
        "keep": Field("int", 3, "snapshots kept", min=1),
        "every_seconds": Field("float", 30.0, "checkpoint at least this often", min=0),
        "every_batches": Field("int", 100, "checkpoint after this many batches", min=1),
        "snapshot_topic": Field("str", None, "also publish each durable snapshot on this Kafka topic (one "
                                "partition), for scorers without the checkpoint directory (docs/serving.md)"),
        "snapshot_chunk_bytes": Field("int", 1000000, "payload bytes of one snapshot-topic message: keep it "
                                      "under the broker's message.max.bytes", min=1024),
    },
    "metrics": {
        "enabled": Field("bool", True, "serve Prometheus metrics"),
        "host": Field("str", "127.0.0.1", "address the metrics endpoint binds to"),
        "port": Field("int", 9464, "metrics port (0 = any free port)", min=0, max=65535),
        "evaluation": Field("str", None, "the held-out signal of metrics, history, progress and promotion: "
                            "prequential (each minibatch scored at the parameters before it is learned; "
                            "no record withheld) or reservoir (heldout_size records withheld for good); "
                            "unset: prequential, or reservoir where heldout_size or heldout_every is set",
                            choices=("prequential", "reservoir")),
        "prequential_sample": Field("int", 64, "prequential: records of each minibatch scored, evenly "
                                    "spaced (0 = all of them); 64 costs 0.24x an LDA update on NYT "
                                    "at |S| = 256 (bench/prequential.py)", min=0),
        "prequential_fading": Field("float", 0.001, "prequential: fading factor per record of the smoothed "
                                    "figure (about 1/this many records of memory)", min=0, max=1),
        "heldout_size": Field("int", 500, "reservoir: records diverted (not trained on) into the held-out "
                              "reservoir; 0 disables the held-out metric", min=0),
        "heldout_every": Field("int", 50, "recompute the held-out log-likelihood every this many batches "
                               "(Prometheus scrapes every few seconds; more often only costs time)",
                               min=1),
        "history_every": Field("int", 10, "keep one row of metric history (history.jsonl next to the "
                               "snapshots, for `streamsvi report`) every this many updates", min=1),
        "progress_seconds": Field("float", 2.0, "console progress line interval (0 = off)", min=0),
    },
    # Which snapshot scorers follow (streamsvi.service.promotion; docs/running.md "Promotion").
    "promotion": {
        "enabled": Field("bool", True, "move the 'promoted' pointer (what streamsvi.load and "
                         "SnapshotWatcher follow) only to snapshots whose held-out log predictive density "
                         "is not worse than the promoted one's by more than tolerance; false: no pointer, "
                         "scorers follow 'latest'"),
        "tolerance": Field("float", 0.1, "nats per record (per document for lda) a candidate may be "
                           "worse than the promoted snapshot and still be promoted", min=0),
        "window": Field("int", 1000, "prequential: records scored under both the candidate and the "
                        "promoted snapshot before deciding (keep it below the records between "
                        "checkpoints, or a newer snapshot supersedes the candidate first)", min=1),
    },
    # Only read by `streamsvi run --role worker|applier` (README "Scaling out").
    "scaleout": {
        "deltas_topic": Field("str", None, "topic (one partition) carrying the workers' statistic "
                              "deltas to the applier; required for --role worker/applier"),
        "lambda_topic": Field("str", None, "topic (one partition) on which the applier publishes lambda "
                              "(full lambdas in chunks and a record per applied delta) and workers replay "
                              "it: workers need only the bootstrap servers; the default when lambda_file "
                              "is unset: <deltas_topic>-lambda"),
        "lambda_file": Field("str", None, "publish lambda as a file instead of on lambda_topic (storage "
                             "the applier and every worker share; not both)"),
        "lambda_chunk_bytes": Field("int", 1000000, "payload bytes of one full-lambda message: keep it "
                                    "under the broker's message.max.bytes (Kafka's default 1048588)",
                                    min=1024),
        "lambda_full_every": Field("int", 1000, "the applier writes a full lambda on lambda_topic every "
                                   "this many versions (and at its takeover): a late worker replays at "
                                   "most this many steps", min=1),
        "lambda_full_ratio": Field("float", 4.0, "... or once the deltas applied since the last full lambda "
                                   "hold this many times its bytes (a late worker reads at most about "
                                   "1 + this many full lambdas)", min=0),
        "worker_id": Field("str", None, "this worker's id (stable across restarts: its transactional "
                           "id); default $STREAMSVI_WORKER_ID, else the host name"),
        "applier_group_id": Field("str", None, "consumer group of the appliers on the deltas topic "
                                  "(one active, the others stand by); default <source.group_id>-applier"),
        "max_staleness": Field("int", None, "deltas computed at a lambda more than this many versions "
                               "older than the applier's are down-weighted or dropped (stale_policy); "
                               "unset: 16 for statistic deltas, 4 for gradients (logistic, softmax: "
                               "streamsvi.inference.split_gradient)", min=1),
        "stale_policy": Field("str", "downweight", "downweight: step size rho_t * max_staleness / "
                              "staleness (records still counted); drop: not applied (records counted "
                              "in streamsvi_deltas_skipped_total{reason=\"stale\"} only)",
                              choices=("downweight", "drop")),
        "transaction_timeout_ms": Field("int", 60000, "worker transaction timeout (Kafka aborts a dead "
                                        "worker's open transaction after it)", min=1),
        "commit_every_batches": Field("int", None, "a worker commits the deltas and offsets of this "
                                      "many batches in one Kafka transaction (more: less worker and "
                                      "broker work per record; the k-th delta of a transaction is at "
                                      "least k - 1 versions stale); unset: the default staleness bound, "
                                      "16 for statistic deltas, 4 for gradients, so a worker's own "
                                      "deltas are never down-weighted", min=1),
        "commit_seconds": Field("float", 0.5, "... or once its open transaction is this old (and at "
                                "every empty poll and stop)", min=0),
        "compact_below": Field("float", 0.01, "a worker's LDA delta travels as float32 entries behind a "
                               "bitmap, entries below this many tokens rounded at random to 0 or to it "
                               "(unbiased; on NYT 3-4x fewer bytes for the broker); 0: exact float64 "
                               "deltas (docs/scale-out.md)", min=0),
        "publish_seconds": Field("float", 0.0, "the applier publishes lambda at most this often "
                                 "(0 = after every poll that applied deltas)", min=0),
    },
    # drift that the learner answers (streamsvi.service.drift; docs/drift.md)
    "drift": {
        "detector": Field("str", "none", "change detector on the prequential log predictive density: "
                          "none, page_hinkley or adwin (river.drift)",
                          choices=("none", "page_hinkley", "adwin")),
        "response": Field("str", "floor", "what a detected drop does from the next update: floor (rho_t "
                          ">= rho_floor for floor_steps updates), restart (the step clock restarted: rho "
                          "as at t = 0 again) or reanneal (the annealer of inference.annealing, "
                          "deterministic or stochastic, restarted)",
                          choices=("floor", "restart", "reanneal")),
        "rho_floor": Field("float", 0.2, "the floor of response = floor, in (0, 1]", min=0, max=1),
        "floor_steps": Field("int", 30, "updates the floor of response = floor lasts", min=1),
        "direction": Field("str", "drop", "drop: only a fall of the lpd is a change; both: a rise too",
                           choices=("drop", "both")),
        "warmup": Field("int", 20, "batches before the first detection; also the window of the lpd's "
                        "batch-to-batch sd that scales what the detector sees", min=1),
        "threshold": Field("float", 15.0, "page_hinkley: alarm threshold lambda, in sds of one batch's lpd",
                           min=0),
        "delta": Field("float", 0.5, "page_hinkley: change allowed per batch, in sds of one batch's lpd",
                       min=0),
        "min_instances": Field("int", 10, "page_hinkley: batches after a (re)start before it can alarm",
                               min=1),
        "adwin_delta": Field("float", 0.002, "adwin: confidence delta of a cut", min=0, max=1),
        "adwin_clock": Field("int", 1, "adwin: check for a cut every this many batches", min=1),
        "grace_period": Field("int", 10, "adwin: batches after a (re)start before it can cut", min=1),
    },
    "scorer": {
        "output_topic": Field("str", None, "--role scorer: topic the scored records go to (required)"),
        "group_id": Field("str", None, "the scorers' consumer group on the records topics (default "
                          "<source.group_id>-scorer: never the daemon's group)"),
        "scorer_id": Field("str", None, "this scorer's id (stable across restarts: its transactional id); "
                           "default $STREAMSVI_SCORER_ID, else the host name"),
        "snapshot_topic": Field("str", None, "read snapshots from this topic (the daemon's "
                                "checkpoint.snapshot_topic) instead of checkpoint.directory"),
        "follow": Field("str", "promoted", "in checkpoint.directory, the snapshot the scorer serves: "
                        "promoted (on held-out evidence, [promotion]; latest where there is no promoted "
                        "pointer) or latest (every new snapshot)", choices=("promoted", "latest")),
        "from_lambda": Field("bool", False, "score with the scale-out applier's lambda ([scaleout] "
                             "lambda_topic, or lambda_file) instead of snapshots: each lambda version is "
                             "a snapshot, numbered by its step"),
        "snapshot_poll_seconds": Field("float", 1.0, "look for a newer snapshot at most this often "
                                       "(between transactions)", min=0),
        "commit_every_batches": Field("int", 8, "commit the scored records and the input offsets of this "
                                      "many batches in one transaction", min=1),
        "commit_seconds": Field("float", 0.5, "... or once the open transaction is this old (and at every "
                                "empty poll and stop)", min=0),
        "transaction_timeout_ms": Field("int", 60000, "scorer transaction timeout (Kafka aborts a dead "
                                        "scorer's open transaction after it)", min=1000),
    },
}


#: [inference] settings only the gradient path (a GradientModel) takes
GRADIENT_KEYS = ("estimator", "n_samples", "quadrature_points", "optimizer", "learning_rate", "covariance",
                 "rank", "kl")
#: [inference] settings of the conjugate path that the gradient path has no use for
SVI_ONLY_KEYS = ("effective_batch_size", "effective_fraction", "annealing")


#: ``[inference.annealing]``: kind -> its settings (streamsvi.inference.annealing; defaults there)
ANNEALING: dict[str, dict[str, Field]] = {
    "none": {},
    "svi+": {
        "M0": Field("float", None, "effective batch size M (at t = 0 for a schedule); or fraction",
                    min=0),
        "fraction": Field("float", None, "constant M = fraction * |S|, in (0, 1]", min=0, max=1),
        "schedule": Field("str", "constant", "M_t: constant M0; linear min(|S|, M0 + increment*t); "
                          "geometric min(|S|, M0 * growth^t)", choices=("constant", "linear", "geometric")),
        "increment": Field("float", 1.0, "records added to M per step (linear)", min=0),
        "growth": Field("float", 1.1, "factor on M per step, > 1 (geometric)", min=1),
    },
    "deterministic": {
        "T0": Field("float", 5.0, "initial temperature T_1 >= 1", min=1),
        "schedule": Field("str", "geometric", "T_t = 1 + (T0-1) rate^(t-1) (geometric), "
                          "1 + (T0-1) max(0, 1 - t/n_steps) (linear) or 1/(1 - (1 - 1/T0) rate^(t-1)) "
                          "(inverse; T0 = 10, rate = 0.9 is seed 002's (1 - 0.9^t)^-1)",
                          choices=("geometric", "linear", "inverse")),
        "rate": Field("float", 0.9, "cooling rate in (0, 1) (geometric, inverse)", min=0, max=1),
        "n_steps": Field("int", 100, "T_t = 1 after this many steps", min=1),
        "dirichlet": Field("str", "natural", "how a Dirichlet block is tempered: natural (1 + (alpha - 1)/T) "
                           "or concentration (alpha/T)", choices=("natural", "concentration")),
        "jitter": Field("float", 0.0, "symmetry-breaking jitter: the target's Dirichlet entries times "
                        "exp(jitter z), z ~ N(0, 1), seeded; 0 = off (dense models only)", min=0),
        "jitter_at": Field("str", "cooling", "the steps that jitter: every cooling step, or only the "
                           "first at T = 1 (crossing)", choices=("cooling", "crossing")),
    },
    "stochastic": {
        "rho0": Field("float", 0.9, "weight of the random restart at t = 1, in [0, 1]", min=0, max=1),
        "schedule": Field("str", "geometric", "rho_t = rho0 decay^(t-1) (geometric) or "
                          "rho0 max(0, 1 - t/n_steps) (linear)", choices=("geometric", "linear")),
        "decay": Field("float", 0.9, "decay in (0, 1) (geometric)", min=0, max=1),
        "n_steps": Field("int", 100, "rho_t = 0 (plain updates) after this many steps", min=1),
        "local_restart": Field("bool", False, "lda: also restart each document's q(pi_d) with weight "
                               "rho_t (seed 002 section 4.1)"),
    },
}


def _check_annealing(inf: dict, model_kind: str) -> None:
    """Validate ``inference.annealing`` in place: its settings, resolved with defaults."""
    from ..inference.annealing import annealer_from_dict

    given = inf["annealing"]
    if given is None:
        return
    if "kind" not in given:
        raise ConfigError(f"inference.annealing.kind: required, one of {', '.join(ANNEALING)}")
    kind = _check("inference.annealing", "kind", Field("str", None, "", choices=tuple(ANNEALING)),
                  given["kind"])
    fields = ANNEALING[kind]
    extra = sorted(set(given) - set(fields) - {"kind"})
    if extra:
        raise ConfigError(f"inference.annealing: unknown setting(s) {extra} for kind = {kind!r}; "
                          f"known: {sorted(fields) or 'none'}")
    sec = {k: _check("inference.annealing", k, fields[k], v) for k, v in given.items() if k != "kind"}
    if (inf["effective_batch_size"] is not None or inf["effective_fraction"] is not None):
        raise ConfigError("inference: set [inference.annealing] or effective_batch_size/effective_fraction, "
                          "not both (effective_batch_size = M is kind = 'svi+' with M0 = M)")
    kinds = model_class(model_kind).annealing_kinds      # from its capability types (models.base)
    if kind not in kinds:
        raise ConfigError(f"inference.annealing.kind: {kind!r} is not defined for model.kind = "
                          f"{model_kind!r} (it has no local latent assignments to temper or restart); "
                          f"use {' or '.join(repr(k) for k in kinds)}")
    if kind == "svi+" and sec.get("schedule", "constant") == "constant" and sec.get("M0") is not None \
            and sec["M0"] > inf["batch_size"]:
        raise ConfigError(f"inference.annealing.M0: must be in (0, batch_size={inf['batch_size']}], "
                          f"got {sec['M0']:g}")
    try:
        inf["annealing"] = annealer_from_dict({"kind": kind, **sec}).to_dict()
    except ValueError as exc:
        raise ConfigError(f"inference.annealing: {exc}") from None


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the field."""


#: secret settings refused as literal values -> the stem of their _env / _file settings
LITERAL_SECRETS = {"sasl_password": "sasl_password", "sasl_plain_password": "sasl_password",
                   "ssl_password": "ssl_password"}


def _secret_source(src: dict, stem: str):
    """``("env", NAME)``, ``("file", PATH)`` or None for the secret ``stem`` (sasl_password, ssl_password)."""
    env, path = src.get(f"{stem}_env"), src.get(f"{stem}_file")
    if env is not None and path is not None:
        raise ConfigError(f"source: set {stem}_env or {stem}_file, not both")
    return ("env", env) if env is not None else ("file", path) if path is not None else None


def read_secret(src: dict, stem: str) -> str | None:
    """The secret ``stem`` of a ``[source]`` section, read now from its variable or file.

    Raises :class:`ConfigError` naming the setting if the variable is unset or
    empty, or the file is missing, unreadable or empty. A file's trailing
    newline is not part of the secret.
    """
    where = _secret_source(src, stem)
    if where is None:
        return None
    how, name = where
    if how == "env":
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"source.{stem}_env: environment variable {name} is "
                              f"{'empty' if value == '' else 'not set'}; export {name} with the "
                              f"password before starting streamsvi")
        return value
    try:
        value = Path(name).read_text(encoding="utf-8").rstrip("\r\n")
    except FileNotFoundError:
        raise ConfigError(f"source.{stem}_file: {name} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"source.{stem}_file: {name} is a directory, not a file with the "
                          f"password") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"source.{stem}_file: cannot read {name}: {exc}") from None
    if not value:
        raise ConfigError(f"source.{stem}_file: {name} is empty")
    return value


def _check_security(src: dict, given: dict, base_dir: Path | None) -> None:
    """Cross-field rules of the security settings; resolves their paths; checks the secrets exist."""
    proto = src["security_protocol"]
    sasl, tls = proto.startswith("SASL_"), proto in ("SSL", "SASL_SSL")
    for key in ("sasl_mechanism", "sasl_username", "sasl_password_env", "sasl_password_file"):
        if src[key] is not None and not sasl:
            raise ConfigError(f"source.{key}: only used with security_protocol = SASL_PLAINTEXT or "
                              f"SASL_SSL, got {proto!r}")
    unset = {"ssl_check_hostname": True}          # (the others' default is None)
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password_env", "ssl_password_file",
                "ssl_check_hostname"):
        # a resolved config (load_config's output, defaults filled in) validates again
        if key in given and given[key] != unset.get(key) and not tls:
            raise ConfigError(f"source.{key}: only used with security_protocol = SSL or SASL_SSL, "
                              f"got {proto!r}")
    if sasl:
        for key in ("sasl_mechanism", "sasl_username"):
            if src[key] is None:
                raise ConfigError(f"source.{key}: required with security_protocol = {proto!r}")
        if _secret_source(src, "sasl_password") is None:
            raise ConfigError(f"source: security_protocol = {proto!r} needs the SASL password: set "
                              f"sasl_password_env (an environment variable) or sasl_password_file")
    if src["ssl_keyfile"] is not None and src["ssl_certfile"] is None:
        raise ConfigError("source.ssl_keyfile: needs ssl_certfile (the client certificate)")
    if _secret_source(src, "ssl_password") is not None and src["ssl_certfile"] is None:
        raise ConfigError("source: ssl_password_env / ssl_password_file is the password of an "
                          "encrypted client key; set ssl_certfile (and ssl_keyfile) too")
    for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "sasl_password_file", "ssl_password_file"):
        p = src[key]
        if p is None:
            continue
        if base_dir is not None and not Path(p).is_absolute():   # relative to the config file
            p = src[key] = str((base_dir / p).resolve())
        if not Path(p).is_file():
            raise ConfigError(f"source.{key}: {p} " + ("is not a file" if Path(p).exists()
                                                       else "does not exist"))
        if key.endswith("password_file") and os.name == "posix" and Path(p).stat().st_mode & 0o077:
            log.warning("source.%s: %s can be read by other users; chmod 600 it", key, p)
    read_secret(src, "sasl_password")      # fail at load, not at the first connection
    key_password = read_secret(src, "ssl_password")
    if tls:                                # the PEM files load as kafka-python will load them
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if src["ssl_cafile"] is not None:
            try:
                ctx.load_verify_locations(src["ssl_cafile"])
            except (ssl.SSLError, OSError) as exc:
                raise ConfigError(f"source.ssl_cafile: {src['ssl_cafile']} holds no usable PEM "
                                  f"certificate ({exc})") from None
        if src["ssl_certfile"] is not None:
            try:
                # no password: a callable giving none, so that OpenSSL never prompts on the terminal
                ctx.load_cert_chain(src["ssl_certfile"], src["ssl_keyfile"],
                                    password=key_password if key_password is not None else lambda: b"")
            except (ssl.SSLError, OSError) as exc:
                hint = ("or the key's password (ssl_password_env / ssl_password_file) is wrong"
                        if key_password is not None else "or the key is encrypted: give its password "
                        "with ssl_password_env or ssl_password_file")
                raise ConfigError(f"source.ssl_certfile: cannot load the client certificate "
                                  f"{src['ssl_certfile']} with key {src['ssl_keyfile'] or '(in the same file)'}"
                                  f" ({exc}); the certificate and key must be PEM files that "
                                  f"belong together, {hint}") from None


def client_security(cfg: dict) -> dict:
    """The kafka-python settings of ``cfg``'s ``[source]`` security, secrets read now.

    One function for every client streamsvi makes (the consumer, the
    dead-letter producer, the highwater probes, ``streamsvi produce``):
    ``KafkaConsumer(**other_settings, **client_security(cfg))``. Empty for
    PLAINTEXT. ``cfg`` is a validated config, or just its ``[source]`` section.
    """
    src = cfg.get("source", cfg)
    proto = src.get("security_protocol", "PLAINTEXT")
    if proto == "PLAINTEXT":
        return {}
    out = {"security_protocol": proto}
    if proto.startswith("SASL_"):
        out.update(sasl_mechanism=src["sasl_mechanism"], sasl_plain_username=src["sasl_username"],
                   sasl_plain_password=read_secret(src, "sasl_password"))
    if proto in ("SSL", "SASL_SSL"):
        out["ssl_check_hostname"] = src["ssl_check_hostname"]
        for key in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
            if src[key] is not None:
                out[key] = src[key]
        password = read_secret(src, "ssl_password")
        if password is not None:
            out["ssl_password"] = password
    return out


def _check(section: str, name: str, f: Field, v):
    where = f"{section}.{name}"
    t = f.type
    if t == "float|auto":
        if v == "auto":
            return v
        t = "float"
    if t == "int":
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(f"{where}: expected an integer, got {v!r}")
    elif t == "float":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}: expected a finite number, got {v!r}")
        v = float(v)
    elif t == "str":
        if not isinstance(v, str) or not v:
            raise ConfigError(f"{where}: expected a non-empty string, got {v!r}")
    elif t == "bool":
        if not isinstance(v, bool):
            raise ConfigError(f"{where}: expected true or false, got {v!r}")
    elif t == "dict":
        if not isinstance(v, dict):
            raise ConfigError(f"{where}: expected a table ([{where}]), got {v!r}")
    elif t == "list[str]":
        if not isinstance(v, list) or not v or not all(isinstance(s, str) and s for s in v):
            raise ConfigError(f"{where}: expected a non-empty list of strings, got {v!r}")
    if f.choices and v not in f.choices:
        raise ConfigError(f"{where}: expected one of {', '.join(f.choices)}, got {v!r}")
    if f.min is not None and isinstance(v, (int, float)) and v < f.min:
        raise ConfigError(f"{where}: must be >= {f.min:g}, got {v!r}")
    if f.max is not None and isinstance(v, (int, float)) and v > f.max:
        raise ConfigError(f"{where}: must be <= {f.max:g}, got {v!r}")
    return v


def _check_section(section: str, fields: dict, given: dict) -> dict:
    """One table other than ``[model]`` checked against its fields, every default filled in."""
    extra = set(given) - set(fields)
    literal = sorted(extra & set(LITERAL_SECRETS)) if section == "source" else []
    if literal:
        k = literal[0]
        raise ConfigError(f"source.{k}: secrets are not read from the config file (it ends up in "
                          f"snapshots and --print-config); set {LITERAL_SECRETS[k]}_env = \"VAR\" "
                          f"(an environment variable) or {LITERAL_SECRETS[k]}_file = \"path\"")
    if extra:
        hint = did_you_mean(sorted(extra)[0], fields)
        raise ConfigError(f"{section}: unknown setting(s) {sorted(extra)}{hint}; known: {sorted(fields)}")
    sec = {}
    for name, f in fields.items():
        if name in given:
            sec[name] = _check(section, name, f, given[name])
        elif f.default is REQUIRED:
            raise ConfigError(f"{section}.{name}: required ({f.doc})")
        else:
            sec[name] = copy.deepcopy(f.default)
    return sec


def source_settings(path) -> dict | None:
    """The ``[source]`` table of the config file at ``path``, checked and with its defaults,
    or None if the file cannot be read or the table is not valid (:func:`load_config` then
    says why).

    Only that table: the rest of :func:`validate` imports the models and numpy. ``streamsvi
    run`` uses it to start its consumer group join before those imports
    (:class:`streamsvi.io.sources.kafka.EarlyJoin`); the daemon's source is still made from
    the fully validated config, and takes that consumer over only if its settings are the same.
    """
    try:
        raw = tomllib.loads(Path(path).read_text())
        given = raw.get("source", {})
        return _check_section("source", SCHEMA["source"], given) if isinstance(given, dict) else None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, ConfigError):
        return None


def validate(raw: dict, base_dir: Path | None = None) -> dict:
    """Check a parsed config against :data:`SCHEMA`, fill defaults, return a new dict."""
    if not isinstance(raw, dict):
        raise ConfigError("config must be a TOML table")
    sections = set(SCHEMA) | {"records"}
    unknown = set(raw) - sections
    if unknown:
        hint = "".join(did_you_mean(u, sections) for u in sorted(unknown)[:1])
        raise ConfigError(f"unknown section(s) {sorted(unknown)}{hint}; known: {sorted(sections)}")
    out = {}
    for section, fields in SCHEMA.items():
        given = raw.get(section, {})
        if not isinstance(given, dict):
            raise ConfigError(f"{section}: expected a table, got {given!r}")
        if section == "model":              # the chosen kind's own table (model_schema)
            out[section] = _check_model(given)
            continue
        out[section] = _check_section(section, fields, given)
    # cross-field rules
    inf, src, mdl = out["inference"], out["source"], out["model"]
    cls = model_class(mdl["kind"])
    kind = _record_kind(cls)
    out["records"] = _check_records(raw.get("records", {}), kind, mdl["kind"])
    if inf["n_total"] != "auto" and inf["n_total"] <= 0:
        raise ConfigError(f"inference.n_total: must be > 0 (N, the data-set or population size), "
                          f"got {inf['n_total']:g}")
    if inf["effective_batch_size"] is not None and inf["effective_fraction"] is not None:
        raise ConfigError("inference: set effective_batch_size or effective_fraction, not both")
    if inf["effective_batch_size"] is not None and not 0 < inf["effective_batch_size"] <= inf["batch_size"]:
        raise ConfigError(f"inference.effective_batch_size: must be in (0, batch_size={inf['batch_size']}], "
                          f"got {inf['effective_batch_size']:g}")
    if inf["effective_fraction"] is not None and inf["effective_fraction"] <= 0:
        raise ConfigError("inference.effective_fraction: must be in (0, 1]")
    _check_annealing(inf, mdl["kind"])
    if inf["schedule"] == "robbins_monro" and not 0.5 < inf["kappa"] <= 1:
        raise ConfigError(f"inference.kappa: must be in (0.5, 1], got {inf['kappa']:g}")
    CONFIG_KINDS, GradientModel = _config_kinds(), _gradient_model()
    if issubclass(cls, GradientModel):
        for key in SVI_ONLY_KEYS:
            if inf[key] is not None:
                raise ConfigError(f"inference.{key}: SVI+ and annealing settings do not apply to kind = "
                                  f"{mdl['kind']!r} (the gradient path); remove it")
    else:
        for key in GRADIENT_KEYS:
            if inf[key] is not None:
                gradient = sorted(k for k, c in CONFIG_KINDS.items() if issubclass(c, GradientModel))
                raise ConfigError(f"inference.{key}: only used by the gradient path "
                                  f"(model.kind = {', '.join(gradient)}); remove it")
    model = build_model(mdl)               # the model's own cross-setting rules, before any connection
    _check_security(src, raw.get("source", {}), base_dir)
    if inf["n_total"] == "auto" and src["codec"] == "binary":
        raise ConfigError("inference.n_total: 'auto' counts messages (the topics' highwater marks), "
                          "but a binary message carries a whole minibatch; set N as a number")
    if src["codec"] not in kind.codec_names:
        raise ConfigError(f"source.codec: {src['codec']!r} is not a codec of {kind.name!r} records "
                          f"(model.kind = {mdl['kind']!r}); use one of {', '.join(kind.codec_names)}")
    if src["vocabulary"] is not None and src["codec"] != "text":
        raise ConfigError("source.vocabulary: only used by codec = 'text'")
    if src["kind"] == "kafka":
        if (src["topics"] is None) == (src["pattern"] is None):
            raise ConfigError("source: set exactly one of topics or pattern")
    else:
        if src["path"] is None:
            raise ConfigError("source.path: required for a file source")
        if inf["n_total"] == "auto":
            pass  # file source: auto = number of lines, resolved at start
    if src["fields"] is not None:
        n_fields = kind.n_fields(model)
        if n_fields is None:
            raise ConfigError(f"source.fields: {kind.name!r} records (model.kind = {mdl['kind']!r}) are "
                              f"not read by field names; remove it")
        if len(src["fields"]) != n_fields:
            raise ConfigError(f"source.fields: {kind.name!r} records of model.kind = {mdl['kind']!r} take "
                              f"{n_fields} name(s), got {len(src['fields'])}")
    _resolve_evaluation(out["metrics"], raw.get("metrics"))
    sc = out["scaleout"]
    if sc["commit_seconds"] * 1000 * 2 > sc["transaction_timeout_ms"]:
        raise ConfigError(f"scaleout.commit_seconds: {sc['commit_seconds']:g} s must be at most half of "
                          f"scaleout.transaction_timeout_ms ({sc['transaction_timeout_ms']} ms), or the "
                          f"broker may abort an open transaction before the worker commits it")
    if base_dir is not None:   # relative paths are relative to the config file
        for sec, key in (("checkpoint", "directory"), ("source", "path"), ("source", "dead_letter_path"),
                         ("source", "vocabulary"), ("scaleout", "lambda_file")):
            p = out[sec][key]
            if p is not None and not Path(p).is_absolute():
                out[sec][key] = str((base_dir / p).resolve())
    from .drift import check_config as _check_drift      # [drift] rules across sections
    _check_drift(out)
    # the engine's own rules (covariance = lowrank needs rank, ...), also before any connection
    build_engine(out, 1.0 if inf["n_total"] == "auto" else float(inf["n_total"]), model=model)
    return out


def _resolve_evaluation(mc: dict, given) -> None:
    """``metrics.evaluation`` unset: ``reservoir`` where the config sets ``heldout_size`` or
    ``heldout_every`` (a config written before prequential evaluation keeps its reservoir),
    else ``prequential``."""
    if mc["evaluation"] is None:
        given = given if isinstance(given, dict) else {}
        mc["evaluation"] = "reservoir" if ("heldout_size" in given or "heldout_every" in given) \
            else "prequential"


def load_config(path) -> dict:
    """Read and validate a TOML config file."""
    p = Path(path)
    try:
        raw = tomllib.loads(p.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {p} does not exist") from None
    except IsADirectoryError:
        example = next(iter(sorted(p.glob("*.toml"))), None)
        raise ConfigError(f"config {p} is a directory; give a TOML file"
                          + (f", e.g. --config {example}" if example else "")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {p}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: not valid TOML: {exc}") from None
    return validate(raw, base_dir=p.resolve().parent)


def model_class(kind: str):
    """The model class of a ``model.kind`` (a look-up in ``streamsvi.models.CONFIG_KINDS``)."""
    CONFIG_KINDS = _config_kinds()
    try:
        return CONFIG_KINDS[kind]
    except KeyError:
        raise ConfigError(f"model.kind: expected one of {', '.join(CONFIG_KINDS)}, got {kind!r}"
                          f"{did_you_mean(str(kind), CONFIG_KINDS)}") from None


def model_schema(kind: str) -> dict:
    """``{TOML name: Setting}`` of ``model.kind = kind``: its class's table, with the kind's preset
    defaults and docs (what ``--print-config`` shows and the README documents)."""
    cls = model_class(kind)
    preset = cls.config_kinds[kind]
    out = {}
    for name, st in cls.settings.items():
        if st.config:
            out[st.config_name or name] = dataclasses.replace(
                st, default=preset.defaults.get(name, st.default), doc=preset.docs.get(name, st.doc))
    return out


def _record_kind(cls):
    from ..io import records   # noqa: F401  (importing streamsvi.io registers every record kind)
    from ..io.records import kind_named

    return kind_named(cls.record_kind, cls.name)


def _check_model(given: dict) -> dict:
    """The ``[model]`` table checked against its kind's settings table, every default filled in."""
    from ..settings import SettingError, check_settings

    CONFIG_KINDS = _config_kinds()
    if "kind" not in given:
        raise ConfigError(f"model.kind: required, one of {', '.join(CONFIG_KINDS)}")
    kind = given["kind"]
    cls = model_class(kind)
    table = model_schema(kind)
    extra = sorted(k for k in given if k != "kind" and k not in table)
    if extra:
        owners = {k: [o for o in CONFIG_KINDS if k in model_schema(o)] for k in extra}
        if all(owners.values()):
            text = "; ".join(f"{k} is for " + ", ".join(o) for k, o in owners.items())
            raise ConfigError(f"model: setting(s) {extra} do not apply to kind = {kind!r} ({text}); "
                              f"remove them. kind = {kind!r} takes: {', '.join(sorted(table))}")
        k = next(k for k, o in owners.items() if not o)
        raise ConfigError(f"model.{k}: not a setting of kind = {kind!r}{did_you_mean(k, table)} "
                          f"(kind = {kind!r} takes: {', '.join(sorted(table))})")
    preset = cls.config_kinds[kind]
    try:
        values = check_settings(cls.settings, {k: v for k, v in given.items() if k != "kind"},
                                defaults=preset.defaults, config=True)
    except SettingError as exc:
        if exc.problem.startswith("is required"):
            raise ConfigError(f"model.{exc.name}: required for kind = {kind!r} "
                              f"({table[exc.name].doc})") from None
        raise ConfigError(f"model.{exc.name}: {exc.problem}") from None
    names = {n: st.config_name or n for n, st in cls.settings.items() if st.config}
    return {"kind": kind, **{names[n]: v for n, v in values.items() if n in names}}


def _check_records(given: dict, kind, model_kind: str) -> dict:
    """The ``[records]`` table checked against the record kind's settings table."""
    from ..settings import SettingError, check_settings

    if not isinstance(given, dict):
        raise ConfigError(f"records: expected a table, got {given!r}")
    try:
        return check_settings(kind.settings, given, config=True)
    except SettingError as exc:
        if not kind.settings:
            raise ConfigError(f"records: {kind.name!r} records (model.kind = {model_kind!r}) have no "
                              f"settings, got {sorted(given)}") from None
        raise ConfigError(f"records.{exc.name}: {exc.problem}") from None


def build_model(model_cfg: dict):
    """The model a validated ``[model]`` section describes."""
    kind = model_cfg["kind"]
    cls = model_class(kind)
    table = model_schema(kind)
    # a config saved by 0.x held every kind's settings, unset ones as None: those are left out
    given = {k: v for k, v in model_cfg.items() if k != "kind" and (k in table or v is not None)}
    values = _check_model({"kind": kind, **given})
    by_arg = {st.config_name or n: n for n, st in cls.settings.items()}
    try:
        return cls.from_config(kind, {by_arg[k]: v for k, v in values.items() if k != "kind"})
    except ValueError as exc:
        raise ConfigError(f"model: {exc}") from None


def build_engine(cfg: dict, n_total: float, model=None):
    """The SVI engine of a validated config, with N resolved to a number (``model``: the config's
    model, already built)."""
    from ..inference import SVI, Constant, RobbinsMonro

    inf = cfg["inference"]
    schedule = (RobbinsMonro(inf["tau0"], inf["kappa"], inf["rho_min"])
                if inf["schedule"] == "robbins_monro" else Constant(inf["rho"]))
    if issubclass(model_class(cfg["model"]["kind"]), _gradient_model()):
        from ..inference.gradients import GradientVI

        covariance = inf["covariance"] or "diagonal"
        # the natural-gradient step is for the mean field: full and lowrank default to adam
        optimizer = inf["optimizer"] or ("natural" if covariance == "diagonal" else "adam")
        lr = inf["learning_rate"] if inf["learning_rate"] is not None else (0.01 if optimizer == "adam" else 1.0)
        if covariance == "lowrank" and inf["rank"] is None:
            raise ConfigError("inference.rank: required with covariance = 'lowrank' (the columns of B in "
                              "diag + B B^T), e.g. rank = 10")
        model = model if model is not None else build_model(cfg["model"])
        try:
            return GradientVI(model, n_total=n_total,
                              estimator=inf["estimator"] or "legrad", n_samples=inf["n_samples"],
                              quadrature_points=inf["quadrature_points"] or 5, schedule=schedule,
                              learning_rate=lr, optimizer=optimizer, covariance=covariance,
                              rank=inf["rank"], kl=inf["kl"])
        except ValueError as exc:
            raise ConfigError(f"inference: {exc}") from None
    model = model if model is not None else build_model(cfg["model"])
    try:
        return SVI(model, n_total=n_total, schedule=schedule,
                   effective_batch_size=inf["effective_batch_size"],
                   effective_fraction=inf["effective_fraction"],
                   boundary_fraction=inf["boundary_fraction"], short_batches="svi",
                   annealer=inf.get("annealing"))
    except ValueError as exc:
        raise ConfigError(f"inference: {exc}") from None
