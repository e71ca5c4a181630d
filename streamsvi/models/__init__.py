"""Conjugate-exponential-family models: one file per model (see ``base``)."""
from .base import NatParams
from .gauss1d import KnownVarianceGMM1D
from .gmm import BayesianGMM
from .hmm import DiscreteHMM
from .lda import LDA
from .pmf import PMF, Ratings
from .hpf import HPF
from .logistic import BayesianLogisticRegression, CorrelatedGaussianTarget, SoftmaxRegression

#: name -> class, for rebuilding a model from saved settings.
MODELS = {cls.name: cls for cls in (BayesianGMM, KnownVarianceGMM1D, DiscreteHMM, LDA, PMF, HPF)}
#: the non-conjugate models (gradient path, streamsvi.models.nonconjugate)
MODELS.update({cls.name: cls for cls in (BayesianLogisticRegression, SoftmaxRegression,
                                          CorrelatedGaussianTarget)})


def model_from_dict(d: dict):
    """Rebuild a model from ``{"name": ..., "params": {...}}``."""
    name = d.get("name")
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(MODELS)}")
    return MODELS[name](**d.get("params", {}))


def model_to_dict(model) -> dict:
    return {"name": model.name, "params": model.get_params()}


__all__ = ["NatParams", "BayesianGMM", "KnownVarianceGMM1D", "DiscreteHMM", "LDA", "PMF", "HPF", "Ratings", "BayesianLogisticRegression", "SoftmaxRegression", "CorrelatedGaussianTarget", "MODELS", "model_from_dict",
           "model_to_dict"]
