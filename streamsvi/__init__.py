"""streamsvi: learn Bayesian models from streams with SVI and SVI+.

The math lives in :mod:`streamsvi.models` (one conjugate model per file) and
:mod:`streamsvi.inference` (the SVI / SVI+ / batch-VI engine).

The names below are imported on first use (PEP 562), so that ``import
streamsvi`` and the ``streamsvi`` command start without loading numpy and
scipy: the command installs its signal handlers before anything heavy
(:mod:`streamsvi.service.signals`).
"""
from ._version import __version__

#: public name -> the submodule that defines it
_LAZY = {
    "SVI": "inference", "Constant": "inference", "EngineState": "inference",
    "RobbinsMonro": "inference", "UpdateInfo": "inference", "batch_vi": "inference",
    "BayesianGMM": "models", "KnownVarianceGMM1D": "models", "NatParams": "models",
    "FittedModel": "scoring", "SnapshotWatcher": "scoring", "load": "scoring",
}

__all__ = ["__version__", "SVI", "Constant", "EngineState", "RobbinsMonro", "UpdateInfo",
           "batch_vi", "BayesianGMM", "KnownVarianceGMM1D", "NatParams", "load", "FittedModel",
           "SnapshotWatcher"]


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
