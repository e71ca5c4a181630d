"""The models: one file per model family (see ``base``), and the one registry of them.

Adding a model family: its file, and its class in the tuple of :data:`MODELS`
below. Everything else (the ``[model]`` kinds of the config, ``--print-config``,
the check suite's cases, the annealing kinds) is read from the class.
"""
from .base import (ChecksState, Classifier, ConjugateModel, CoordinateLoglik, GradientModel, Mixture, Model,
                   NatParams, PairedStats, RandomRestart, RowWise, ScoresRecords, StartsFromData, StoredScaled,
                   Tempered)
from .gauss1d import KnownVarianceGMM1D
from .gmm import BayesianGMM
from .hmm import DiscreteHMM
from .lda import LDA
from .pmf import PMF
from .hpf import HPF
from .poisson_mixture import PoissonMixture
from ..ratings_batch import Ratings
from .logistic import BayesianLogisticRegression, CorrelatedGaussianTarget, SoftmaxRegression

#: The registry: name -> class, for rebuilding a model from saved settings. One line per family.
MODELS = {cls.name: cls for cls in (
    BayesianGMM,
    KnownVarianceGMM1D,
    DiscreteHMM,
    LDA,
    PMF,
    HPF,
    PoissonMixture,
    BayesianLogisticRegression,         # the non-conjugate models (the gradient path,
    SoftmaxRegression,                  # streamsvi.models.nonconjugate)
    CorrelatedGaussianTarget,
)}

#: ``model.kind`` of the config -> class, from each class's ``config_kinds`` (in registry order)
CONFIG_KINDS = {kind: cls for cls in MODELS.values() for kind in cls.config_kinds}


def model_from_dict(d: dict):
    """Rebuild a model from ``{"name": ..., "params": {...}}``."""
    name = d.get("name")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    return MODELS[name](**d.get("params", {}))


def model_to_dict(model) -> dict:
    return {"name": model.name, "params": model.get_params()}


__all__ = ["Model", "ConjugateModel", "GradientModel", "Tempered", "RandomRestart", "StartsFromData",
           "Classifier", "ScoresRecords", "Mixture", "StoredScaled", "RowWise", "ChecksState", "PairedStats",
           "CoordinateLoglik", "CONFIG_KINDS",
           "NatParams", "BayesianGMM", "KnownVarianceGMM1D", "DiscreteHMM", "LDA", "PMF", "HPF", "PoissonMixture", "Ratings", "BayesianLogisticRegression", "SoftmaxRegression", "CorrelatedGaussianTarget", "MODELS", "model_from_dict",
           "model_to_dict"]
