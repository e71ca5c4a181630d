"""dump_toml (streamsvi/service/tomlw.py): what it writes, ``tomllib`` reads back the same."""
import math
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamsvi.service.config import load_config
from streamsvi.service.tomlw import dump_toml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.toml"))


def _without_none(v):
    """What a config means once written: ``None`` values left out, tuples as lists."""
    if isinstance(v, dict):
        return {k: _without_none(x) for k, x in v.items() if x is not None}
    if isinstance(v, (list, tuple)):
        return [_without_none(x) for x in v]
    return v


# --------------------------------------------------------------- config-shaped dicts
_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=12)     # any Unicode but surrogates
_keys = st.one_of(st.from_regex(r"[A-Za-z0-9_-]{1,10}", fullmatch=True), _text)
_scalars = st.one_of(
    st.booleans(),
    st.integers(-(2 ** 63), 2 ** 63 - 1),
    st.floats(allow_nan=False),                  # inf, -inf, -0.0, subnormals included; NaN below
    _text,
)
_arrays = st.recursive(st.lists(_scalars, max_size=4), lambda inner: st.lists(inner, max_size=3), max_leaves=8)
_values = st.one_of(st.none(), _scalars, _arrays, st.tuples(_scalars, _scalars))
_leaf_table = st.dictionaries(_keys, _values, max_size=6)
# sections of settings, a section holding sub-tables too (as [inference.annealing]), and root keys
_sections = st.dictionaries(_keys, st.one_of(
    _leaf_table,
    st.builds(lambda own, sub: {**own, **sub}, _leaf_table, st.dictionaries(_keys, _leaf_table, max_size=2)),
), max_size=5)
_configs = st.builds(lambda root, sections: {**root, **sections}, st.dictionaries(_keys, _values, max_size=3),
                     _sections)


@settings(max_examples=400, deadline=None)
@given(_configs)
def test_tomllib_reads_back_what_dump_toml_writes(cfg):
    assert tomllib.loads(dump_toml(cfg)) == _without_none(cfg)


@settings(max_examples=200, deadline=None)
@given(st.floats(allow_nan=False))
def test_floats_round_trip_bit_for_bit(x):
    back = tomllib.loads(dump_toml({"s": {"x": x}}))["s"]["x"]
    assert back == x and math.copysign(1.0, back) == math.copysign(1.0, x)


def test_the_text_it_writes():
    cfg = {"model": {"kind": "gmm", "n_components": 3, "scale": 1.0, "tiny": 5e-324, "big": 1e300,
                     "prior": None},
           "inference": {"n_total": "auto", "seed": 0, "hot": math.inf, "cold": -math.inf, "odd": math.nan,
                         "annealing": {"kind": "deterministic", "T0": 5.0}},
           "source": {"topics": ["a", "b"], "path": 'C:\\data\\"x".jsonl', "note": "café\tß\x00\x1f\x7f ☃"},
           "validation": {}}
    text = dump_toml(cfg)
    assert text == """\
[model]
kind = "gmm"
n_components = 3
scale = 1.0
tiny = 5e-324
big = 1e+300

[inference]
n_total = "auto"
seed = 0
hot = inf
cold = -inf
odd = nan

[inference.annealing]
kind = "deterministic"
T0 = 5.0

[source]
topics = ["a", "b"]
path = "C:\\\\data\\\\\\"x\\".jsonl"
note = "café\\tß\\u0000\\u001F\\u007F ☃"

[validation]
"""
    back = tomllib.loads(text)
    assert math.isnan(back["inference"].pop("odd"))
    del cfg["inference"]["odd"], cfg["model"]["prior"]
    assert back == cfg


def test_keys_that_are_not_bare_are_quoted():
    cfg = {"a b": {"x.y": 1, "": 2, "ключ": 3, 'q"': 4}, "s": {"t": {"u v": {"w": True}}}}
    text = dump_toml(cfg)
    assert '["a b"]' in text and '[s.t."u v"]' in text
    assert tomllib.loads(text) == cfg


def test_numpy_integers_and_floats():
    np = pytest.importorskip("numpy")
    back = tomllib.loads(dump_toml({"s": {"i": np.int64(7), "f": np.float64(0.1), "l": [np.int32(1)]}}))
    assert back == {"s": {"i": 7, "f": 0.1, "l": [1]}}


@pytest.mark.parametrize("cfg, name", [
    ({"source": {"topics": {"a", "b"}}}, "source.topics"),
    ({"source": {"path": Path("/x")}}, "source.path"),
    ({"source": {"blob": b"x"}}, "source.blob"),
    ({"source": {"topics": ["a", None]}}, r"source.topics\[1\]"),
    ({"inference": {"annealing": {"M0": object()}}}, "inference.annealing.M0"),
    ({"records": {"rows": [{"a": 1}]}}, r"records.rows\[0\]"),
    ({"model": {3: "x"}}, "model.3"),
    ({"model": {"x": 1 + 2j}}, "model.x"),
    (["not", "a", "mapping"], "mapping"),
])
def test_what_it_cannot_write_is_a_type_error_naming_the_key(cfg, name):
    with pytest.raises(TypeError, match=name):
        dump_toml(cfg)


@pytest.mark.parametrize("cfg, name", [
    ({"model": {"seed": 2 ** 63}}, "model.seed"),
    ({"model": {"seed": -(2 ** 63) - 1}}, "model.seed"),
    ({"source": {"path": "a\ud800b"}}, "source.path"),
])
def test_values_toml_cannot_hold_are_a_value_error_naming_the_key(cfg, name):
    with pytest.raises(ValueError, match=name):
        dump_toml(cfg)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_the_example_configs_round_trip(path):
    raw = tomllib.loads(path.read_text())
    assert tomllib.loads(dump_toml(raw)) == raw
    resolved = load_config(path)                      # every default filled in (None: unset)
    assert tomllib.loads(dump_toml(resolved)) == _without_none(resolved)


def test_there_are_example_configs():
    assert len(CONFIGS) >= 10


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_resolved_config_saved_and_loaded_again_is_the_same_config(path, tmp_path):
    """``load_config``'s output (every default filled in) written back and read again. It was
    refused: the filled-in ``source.ssl_check_hostname`` counted as given on PLAINTEXT."""
    cfg = load_config(path)
    (tmp_path / "resolved.toml").write_text(dump_toml(cfg))
    assert load_config(tmp_path / "resolved.toml") == cfg
