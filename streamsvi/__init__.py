"""streamsvi: learn Bayesian models from streams with SVI and SVI+.

The math lives in :mod:`streamsvi.models` (one conjugate model per file) and
:mod:`streamsvi.inference` (the SVI / SVI+ / batch-VI engine).
"""
from ._version import __version__
from .inference import SVI, Constant, EngineState, RobbinsMonro, UpdateInfo, batch_vi
from .models import BayesianGMM, KnownVarianceGMM1D, NatParams
from .scoring import FittedModel, SnapshotWatcher, load

__all__ = ["__version__", "SVI", "Constant", "EngineState", "RobbinsMonro", "UpdateInfo",
           "batch_vi", "BayesianGMM", "KnownVarianceGMM1D", "NatParams", "load", "FittedModel",
           "SnapshotWatcher"]
