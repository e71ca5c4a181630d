"""Save and load an engine and its state as one ``.npz`` file (no pickle).

Layout: one array per natural parameter, ``lam/<name>``, and ``meta.json``, a
UTF-8 JSON document (stored as a uint8 array) with the model's name and
settings, the engine settings, step, records seen, the random-stream state and
the library version. Loading uses ``allow_pickle=False`` and rebuilds the model
from its registered name, so nothing in the file is ever executed.

The engine settings include the annealer's settings (``engine.annealer``, its
``to_dict()``) when one was given; its level is a function of the saved step,
so a loaded state continues the annealing schedule exactly. A file written
before annealers existed has no ``annealer`` entry and loads as before.

A row-wise model's ``state.aux`` (engine docs) is saved too: numpy-array
values as ``aux/<name>`` arrays (numeric dtypes only), everything else under
``"aux"`` in ``meta.json``. States without aux are written exactly as before.
The shapes of λ are checked against the model's prior, or, for a model with
``check_state(lam, aux)`` (whose λ grows with the data), by that method.

The engine class is recorded as ``"engine_class"`` in ``meta.json`` for an
engine other than :class:`~streamsvi.inference.engine.SVI` (today
:class:`~streamsvi.inference.gradients.GradientVI`, the gradient path of
non-conjugate models) and rebuilt by name from :data:`ENGINES` on loading;
files without the key (every SVI state, and those written before it
existed) load as SVI.
"""
from __future__ import annotations

import json
import os

import numpy as np

from .._version import __version__
from ..models import NatParams, model_from_dict, model_to_dict
from ..models.base import ChecksState
from .engine import SVI, EngineState
from .gradients import GradientVI
from .schedules import schedule_from_dict

FORMAT = "streamsvi.state/1"

#: engine class name -> class, for the engines a state file may name (SVI when absent).
ENGINES = {"SVI": SVI, "GradientVI": GradientVI}


def state_to_arrays(engine: SVI, state: EngineState) -> dict[str, np.ndarray]:
    meta = {"format": FORMAT, "version": __version__, "model": model_to_dict(engine.model),
            "engine": engine.to_dict(), "step": state.step, "records_seen": state.records_seen,
            "rng_state": state.rng_state}
    if type(engine) is not SVI:
        meta["engine_class"] = type(engine).__name__
    arrays = {f"lam/{k}": v for k, v in state.lam.items()}
    if state.aux is not None:
        meta["aux"] = {k: v for k, v in state.aux.items() if not isinstance(v, np.ndarray)}
        for k, v in state.aux.items():
            if isinstance(v, np.ndarray):
                if v.dtype.kind not in "biuf":
                    raise TypeError(f"aux array {k!r} has dtype {v.dtype}; only numeric arrays are saved")
                arrays[f"aux/{k}"] = v
    arrays["meta.json"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    return arrays


def state_from_arrays(arrays) -> tuple[SVI, EngineState]:
    if "meta.json" not in arrays:
        raise ValueError("not a streamsvi state: no meta.json entry")
    meta = json.loads(bytes(np.asarray(arrays["meta.json"], dtype=np.uint8)).decode())
    if meta.get("format") != FORMAT:
        raise ValueError(f"unsupported state format {meta.get('format')!r}, expected {FORMAT!r}")
    model = model_from_dict(meta["model"])
    cls_name = meta.get("engine_class", "SVI")
    if cls_name not in ENGINES:
        raise ValueError(f"unknown engine {cls_name!r} in state; known: {sorted(ENGINES)}")
    eng = dict(meta["engine"])
    eng["schedule"] = schedule_from_dict(eng["schedule"])
    engine = ENGINES[cls_name](model, **eng)
    lam = NatParams({k[4:]: np.array(arrays[k]) for k in arrays if k.startswith("lam/")})
    aux = None
    if "aux" in meta:
        aux = dict(meta["aux"])
        aux.update({k[4:]: np.array(arrays[k]) for k in arrays if k.startswith("aux/")})
    check_state_shapes(model, lam, aux)
    if isinstance(engine, GradientVI):             # λ must match its covariance setting
        engine.check_state(lam)
    state = EngineState(step=int(meta["step"]), lam=lam, rng_state=meta["rng_state"],
                        records_seen=int(meta["records_seen"]), aux=aux)
    return engine, state


def check_state_shapes(model, lam, aux=None) -> None:
    """Raise ``ValueError`` unless λ (and aux) can belong to ``model``.

    The names and shapes of the model's prior, or the model's own
    ``check_state(lam, aux)`` for row-wise models whose λ grows.
    """
    if isinstance(model, ChecksState):
        model.check_state(lam, aux)
        return
    expected = set(model.prior())
    if set(lam) != expected:
        raise ValueError(f"state parameters {sorted(lam)} do not match model {sorted(expected)}")
    for k, v in model.prior().items():
        if lam[k].shape != v.shape:
            raise ValueError(f"parameter {k} has shape {lam[k].shape}, model expects {v.shape}")


def save_state(path, engine: SVI, state: EngineState) -> None:
    """Write ``engine`` and ``state`` to ``path`` (an ``.npz`` file)."""
    path = os.fspath(path)
    with open(path, "wb") as f:
        np.savez(f, **state_to_arrays(engine, state))


def load_state(path) -> tuple[SVI, EngineState]:
    """Read what :func:`save_state` wrote; never unpickles."""
    with np.load(os.fspath(path), allow_pickle=False) as z:
        return state_from_arrays({k: z[k] for k in z.files})
