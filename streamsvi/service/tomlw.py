"""Writing a config dict as TOML: :func:`dump_toml`, the inverse of ``tomllib.loads``.

Configs are read with :mod:`tomllib` (:func:`streamsvi.service.config.load_config`); the
standard library has no writer. This is the one writer the package, its tests and its
benchmarks use to write a config back out. It lives apart from ``config.py`` (the schema and
its validation) because it is a plain serialiser that knows nothing of the schema, and so
that a benchmark or test can import it without importing the models.

What it writes (everything a config uses): tables (``[section]``, and nested tables such as
``[inference.annealing]``) of str, bool, int, float, and arrays of those (arrays of arrays
too). ``tomllib.loads(dump_toml(cfg)) == cfg`` for every such ``cfg`` without ``None``
(tuples come back as lists, a NaN as a NaN).

* ``None``: TOML has no null, so a key whose value is ``None`` is left out (a config reads an
  unset setting as its default). ``None`` inside an array cannot be left out: ``TypeError``.
* Strings: basic strings; ``"``, ``\\`` and control characters escaped, everything else
  (non-ASCII included) written as it is. A string holding a lone surrogate cannot be written
  as UTF-8: ``ValueError``.
* Floats: ``repr`` (the shortest text that reads back as the same float); ``inf``, ``-inf``
  and ``nan`` as TOML's ``inf``, ``-inf``, ``nan``.
* Integers: any ``numbers.Integral`` (a numpy integer too) within TOML's 64-bit range;
  outside it, ``ValueError``.
* Anything else (a set, bytes, a Path, a dict inside an array, a non-string key, ...):
  ``TypeError``. Every error names the key, dotted: ``source.topics[1]: ...``.
"""
from __future__ import annotations

import math
import numbers
import re
from collections.abc import Mapping

__all__ = ["dump_toml"]

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
# characters a TOML basic string must escape: " \ and control characters (U+0000-U+001F, U+007F)
_MUST_ESCAPE = re.compile(r'["\\\x00-\x1f\x7f]')
_INT_MIN, _INT_MAX = -(2 ** 63), 2 ** 63 - 1


def dump_toml(cfg: Mapping) -> str:
    """``cfg`` (a mapping of sections, themselves mappings) as TOML text; see the module doc."""
    if not isinstance(cfg, Mapping):
        raise TypeError(f"dump_toml: expected a mapping (dict) of sections, got {type(cfg).__name__}")
    lines: list[str] = []
    _table(cfg, (), lines)
    return "\n".join(lines) + "\n" if lines else ""


def _table(table: Mapping, path: tuple[str, ...], lines: list[str]) -> None:
    """Append ``table`` at ``path``: its header (none for the root), its key = value lines, then
    its sub-tables (TOML puts a table's own keys before the headers of its sub-tables)."""
    subtables = []
    if path:
        if lines:
            lines.append("")
        lines.append(f"[{'.'.join(_key(k, path[:i]) for i, k in enumerate(path))}]")
    for k, v in table.items():
        key = _key(k, path)
        if v is None:
            continue                                  # TOML has no null: unset = left out
        if isinstance(v, Mapping):
            subtables.append((k, v))
        else:
            lines.append(f"{key} = {_value(v, _name(path + (k,)))}")
    for k, v in subtables:
        _table(v, path + (k,), lines)


def _name(path) -> str:
    """The dotted name of a key in error messages: ``inference.annealing.M0``."""
    return ".".join(str(k) for k in path) or "(root)"


def _key(k, path) -> str:
    if not isinstance(k, str):
        raise TypeError(f"dump_toml: {_name(path + (repr(k),))}: keys must be strings, "
                        f"got {type(k).__name__}")
    return k if _BARE_KEY.fullmatch(k) else _string(k, _name(path + (k,)))


def _value(v, name: str) -> str:
    if isinstance(v, bool):                           # before int: bool is an int
        return "true" if v else "false"
    if isinstance(v, numbers.Integral):               # int, numpy integers
        i = int(v)
        if not _INT_MIN <= i <= _INT_MAX:
            raise ValueError(f"dump_toml: {name}: {i} is outside TOML's 64-bit integer range")
        return str(i)
    if isinstance(v, float):                          # float, numpy.float64
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return float.__repr__(float(v))               # shortest text that reads back exactly
    if isinstance(v, str):
        return _string(v, name)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_value(x, f"{name}[{i}]") for i, x in enumerate(v)) + "]"
    if v is None:
        raise TypeError(f"dump_toml: {name}: TOML has no null (None is only left out as a table's value)")
    if isinstance(v, Mapping):
        raise TypeError(f"dump_toml: {name}: a table inside an array is not supported")
    raise TypeError(f"dump_toml: {name}: cannot write {type(v).__name__} {v!r} as TOML")


def _string(s: str, name: str) -> str:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(f"dump_toml: {name}: {s!r} holds a lone surrogate (not valid UTF-8)") from None
    return '"' + _MUST_ESCAPE.sub(lambda m: _ESCAPES.get(m[0]) or f"\\u{ord(m[0]):04X}", s) + '"'
