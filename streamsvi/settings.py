"""Settings tables: one declaration per setting, one validator for the constructor and the TOML.

A model class (``streamsvi.models``) or a record kind (``streamsvi.io.records``)
declares its settings next to its code, as scikit-learn's
``_parameter_constraints``::

    settings = {
        "n_components": Setting("int", 3, "K, the number of components", low=1),
        "kappa": Setting("float", 0.7, "forgetting rate", low=0.5, low_open=True, high=1),
    }

:func:`check_settings` checks given values against a table and fills the
defaults. The constructor calls it with its arguments; ``service/config.py``
calls it with the TOML's ``[model]`` table (its messages then start with
``model.``). One message format for both::

    kappa must be in (0.5, 1], got 0.3
    n_components must be an integer >= 1, got 'big'

This module is a leaf: it imports nothing from the package, so both
``models/`` and ``io/`` use it without crossing the layers.
"""
from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

__all__ = ["Setting", "SettingError", "REQUIRED", "check_settings", "check_value", "did_you_mean",
           "ConfigKind", "settings_doc"]


class _Required:
    def __repr__(self):
        return "REQUIRED"


#: default of a setting that has none: it must be given
REQUIRED = _Required()

#: the types a setting may have
TYPES = ("int", "float", "str", "bool", "float|auto", "numbers")


@dataclass(frozen=True)
class Setting:
    """One setting: its type, range or choices, default and a one-line doc.

    ``type`` is one of :data:`TYPES`: ``"numbers"`` is a number or a (nested)
    list of numbers (a per-component prior, a matrix), each inside the range;
    ``"float|auto"`` a number or the string ``"auto"``. ``default`` may be
    :data:`REQUIRED`, or ``None`` when ``nullable`` (then the model derives the
    value; ``doc`` says how). ``low``/``high`` bound numbers (inclusive unless
    ``low_open``/``high_open``). ``config_name`` is the setting's name in the
    TOML when it differs from the constructor's argument; ``config = False``
    keeps a setting out of the TOML (a Python-only argument). ``required``
    makes the TOML give it even though the constructor has a default.
    """

    type: str
    default: object
    doc: str
    choices: tuple = ()
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    nullable: bool = False
    config_name: str | None = None
    config: bool = True
    required: bool = False

    def __post_init__(self):
        if self.type not in TYPES:
            raise ValueError(f"Setting.type must be one of {', '.join(TYPES)}, got {self.type!r}")

    def range_text(self) -> str:
        """``"in (0.5, 1]"``, ``">= 1"``, ``"> 0"`` or ``""``."""
        lo, hi = self.low, self.high
        if lo is not None and hi is not None:
            return f"in {'(' if self.low_open else '['}{lo:g}, {hi:g}{']' if not self.high_open else ')'}"
        if lo is not None:
            return f"{'>' if self.low_open else '>='} {lo:g}"
        if hi is not None:
            return f"{'<' if self.high_open else '<='} {hi:g}"
        return ""

    def expected(self) -> str:
        """What a valid value is, in words (the start of an error message)."""
        rng = self.range_text()
        sp = f" {rng}" if rng else ""
        if self.choices:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.type == "int":
            text = f"an integer{sp}"
        elif self.type == "float":
            text = f"a finite number{sp}"
        elif self.type == "float|auto":
            text = f"a finite number{sp} or 'auto'"
        elif self.type == "numbers":
            text = f"a finite number{sp} or a list of them"
        elif self.type == "bool":
            text = "true or false"
        else:
            text = "a non-empty string"
        return text + (" (or unset)" if self.nullable and self.default is None else "")


class SettingError(ValueError):
    """A setting with a value it cannot take: ``name`` and the ``problem`` ("must be ..., got ...")."""

    def __init__(self, name: str, problem: str):
        super().__init__(f"{name} {problem}")
        self.name, self.problem = name, problem


def _in_range(s: Setting, v: float) -> bool:
    if s.low is not None and not (v > s.low if s.low_open else v >= s.low):
        return False
    if s.high is not None and not (v < s.high if s.high_open else v <= s.high):
        return False
    return True


def _is_number(v) -> bool:
    return (not isinstance(v, (bool, np.bool_)) and isinstance(v, (int, float, np.integer, np.floating))
            and math.isfinite(v))


def check_value(name: str, s: Setting, v):
    """``v`` checked against ``s`` and coerced (int, float, bool); raises :class:`SettingError`."""
    if v is None and (s.nullable or s.default is None):
        return None
    bad = SettingError(name, f"must be {s.expected()}, got {v!r}")
    given, t = v, s.type
    if t == "float|auto" and isinstance(v, str):
        if v != "auto":
            raise bad
        return v
    if t == "int":
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
            if not (_is_number(v) and float(v).is_integer() and isinstance(v, (float, np.floating))):
                raise bad
        v = int(v)
    elif t in ("float", "float|auto"):
        if not _is_number(v):
            raise bad
        v = float(v)
    elif t == "bool":
        if not isinstance(v, (bool, np.bool_)):
            raise bad
        v = bool(v)
    elif t == "str":
        if not isinstance(v, str) or not v:
            raise bad
    elif t == "numbers":
        try:
            arr = np.asarray(v, dtype=np.float64)
        except (TypeError, ValueError):
            raise bad from None
        if arr.size == 0 or isinstance(v, (bool, np.bool_)) or not np.all(np.isfinite(arr)) \
                or not all(_in_range(s, float(a)) for a in arr.ravel()):
            raise bad
        return v
    if s.choices and v not in s.choices:
        hint = did_you_mean(v, [c for c in s.choices if isinstance(c, str)]) if isinstance(v, str) else ""
        raise SettingError(name, f"must be {s.expected()}, got {v!r}{hint}")
    if t in ("int", "float", "float|auto") and not _in_range(s, v):
        # the right type, out of range: "n_init must be an integer >= 1", "kappa must be in (0.5, 1]"
        raise SettingError(name, f"must be {s.expected() if t == 'int' else s.range_text()}, got {given!r}")
    return v


def did_you_mean(name: str, known) -> str:
    """``"; did you mean 'kappa'?"`` for the closest known name, or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def check_settings(table: Mapping[str, Setting], given: Mapping, *, defaults: Mapping | None = None,
                   config: bool = False) -> dict:
    """The settings ``given``, checked against ``table``, with the defaults of the rest filled in.

    ``defaults`` overrides the table's defaults (a config kind's preset).
    ``config=True`` reads the TOML's names (``config_name``), refuses
    Python-only settings and enforces ``required``; the result is keyed by
    the constructor's names either way. Unknown names raise
    :class:`SettingError` with a "did you mean".
    """
    names = {(s.config_name or n) if config else n: n for n, s in table.items() if s.config or not config}
    for key in given:
        if key not in names:
            raise SettingError(key, f"is not a setting{did_you_mean(key, names)} (known: "
                               f"{', '.join(sorted(names))})")
    out = {}
    for key, n in names.items():
        s = table[n]
        if key in given:
            out[n] = check_value(key, s, given[key])
            continue
        default = (defaults or {}).get(n, s.default)
        if default is REQUIRED or (config and s.required):
            raise SettingError(key, f"is required ({s.doc})")
        out[n] = default
    if not config:
        for n, s in table.items():          # Python-only settings keep their defaults
            out.setdefault(n, (defaults or {}).get(n, s.default))
    return out


@dataclass(frozen=True)
class ConfigKind:
    """A ``model.kind`` name a model class answers to, with its preset.

    ``defaults`` replace the table's defaults (shown by ``--print-config``);
    ``docs`` replace one-line docs whose meaning differs for this kind;
    ``build`` names the classmethod that makes the model from the settings
    (``None``: the constructor).
    """

    doc: str
    defaults: Mapping = field(default_factory=dict)
    docs: Mapping = field(default_factory=dict)
    build: str | None = None


def settings_doc(table: Mapping[str, Setting]) -> str:
    """The table as text, one line per setting (for docstrings and ``--help``)."""
    lines = []
    for n, s in table.items():
        d = "required" if s.default is REQUIRED else f"default {s.default!r}"
        lines.append(f"{n}: {s.type}, {s.expected()}; {d}. {s.doc}")
    return "\n".join(lines)
