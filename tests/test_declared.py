"""Models and record kinds are declared once, next to their code (issue 24, item 2).

* no model-kind name in ``service/``, ``inference/``, ``checkpoint.py``, ``scoring.py`` or ``cli.py`` beyond
  registry look-ups, and no ``hasattr``/``getattr`` probe of a model there (AST scan);
* every registered class carries its settings table, and its constructor's defaults are the
  table's; one validator and one message format for the constructor and the TOML;
* ``--print-config`` shows the chosen kind's settings with their real defaults;
* a typo gets a "did you mean"; ``n_total = 0`` fails at load, before any connection;
* record kinds declare their settings (``count_dtype``, reachable from the config).
"""
import ast
import inspect
from pathlib import Path

import pytest

from streamsvi.models import CONFIG_KINDS, MODELS, Model
from streamsvi.service.config import ConfigError, build_model, model_schema, validate
from streamsvi.settings import REQUIRED, Setting, SettingError, check_settings

PKG = Path(__file__).resolve().parents[1] / "streamsvi"
SCANNED = sorted([*PKG.glob("service/**/*.py"), *PKG.glob("inference/*.py"), PKG / "checkpoint.py",
                  PKG / "scoring.py", PKG / "cli.py"])
BASE = {"inference": {"n_total": 100.0}, "source": {"kind": "file", "path": "x.jsonl"},
        "checkpoint": {"directory": "c"}}


def _kind_names():
    return set(CONFIG_KINDS) | set(MODELS)


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(PKG)))
def test_no_model_kind_name_outside_the_registry(path):
    names = _kind_names()
    found = [(n.lineno, n.value) for n in ast.walk(ast.parse(path.read_text()))
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in names]
    assert not found, f"{path.name}: model-kind names as values (use the registry): {found}"


@pytest.mark.parametrize("path", SCANNED, ids=lambda p: str(p.relative_to(PKG)))
def test_no_attribute_probe_of_a_model(path):
    probes = []
    for n in ast.walk(ast.parse(path.read_text())):
        if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("hasattr", "getattr")
                and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant)
                and "model" in ast.unparse(n.args[0])):
            probes.append((n.lineno, ast.unparse(n)))
    assert not probes, f"{path.name}: probes of a model (ask isinstance of a models.base type): {probes}"


def test_the_scan_finds_what_it_looks_for(tmp_path):
    """The two scans above can fail: they see a kind name and a probe in a file that has them."""
    src = 'def f(engine):\n    if engine.model.name == "lda":\n        return hasattr(engine.model, "svi_step")\n'
    tree = ast.parse(src)
    assert any(isinstance(n, ast.Constant) and n.value in _kind_names() for n in ast.walk(tree))
    assert any(isinstance(n, ast.Call) and getattr(n.func, "id", "") == "hasattr" for n in ast.walk(tree))


@pytest.mark.parametrize("cls", list(MODELS.values()), ids=list(MODELS))
def test_every_model_declares_its_settings(cls):
    assert issubclass(cls, Model)
    sig = inspect.signature(cls.__init__)
    args = [p for p in sig.parameters.values() if p.name != "self"]
    assert [p.name for p in args] == list(cls.settings), "the table lists every argument, in order"
    for p in args:
        st = cls.settings[p.name]
        assert isinstance(st, Setting) and st.doc
        want = REQUIRED if p.default is inspect.Parameter.empty else p.default
        assert st.default == want or (st.default is want), (p.name, st.default, want)
    for kind, preset in cls.config_kinds.items():
        assert CONFIG_KINDS[kind] is cls and set(preset.defaults) <= set(cls.settings)


def test_one_message_format_for_the_constructor_and_the_toml():
    from streamsvi.models import LDA, PMF

    with pytest.raises(ValueError, match=r"^mean_change_tol must be >= 0, got -1$"):
        LDA(n_components=2, n_features=5, mean_change_tol=-1)
    with pytest.raises(ConfigError, match=r"^model.mean_change_tol: must be >= 0, got -1$"):
        validate({**BASE, "model": {"kind": "lda", "n_components": 2, "n_features": 5, "mean_change_tol": -1}})
    with pytest.raises(ValueError, match=r"^row_clock must be one of 'updates', 'ratings', got 'x'$"):
        PMF(row_clock="x")
    table = {"kappa": Setting("float", 0.7, "forgetting rate", low=0.5, low_open=True, high=1)}
    with pytest.raises(SettingError, match=r"^kappa must be in \(0.5, 1\], got 0.3$"):
        check_settings(table, {"kappa": 0.3})
    assert check_settings(table, {}) == {"kappa": 0.7}


def test_a_typo_gets_a_did_you_mean():
    with pytest.raises(ConfigError, match="model.n_compnents: not a setting of kind = 'gmm'; "
                                          "did you mean 'n_components'"):
        validate({**BASE, "model": {"kind": "gmm", "n_components": 2, "n_features": 2, "n_compnents": 3}})
    with pytest.raises(ConfigError, match="model.kind: .* got 'gmn'; did you mean 'gmm'"):
        validate({**BASE, "model": {"kind": "gmn"}})
    with pytest.raises(ConfigError, match="inference: unknown setting\\(s\\) \\['kapa'\\]; did you mean 'kappa'"):
        validate({**BASE, "inference": {"n_total": 10, "kapa": 0.7}, "model": {"kind": "pmf"}})


def test_only_the_chosen_kind_with_its_real_defaults():
    cfg = validate({**BASE, "model": {"kind": "gmm", "n_components": 2, "n_features": 2}})
    m = cfg["model"]
    assert (m["init"], m["n_init"], m["refine_sweeps"], m["init_batches"], m["prior_from"]) == \
        ("kmeans", 3, 100, 4, "auto")
    assert "n_symbols" not in m and "n_factors" not in m and set(m) == {"kind", *model_schema("gmm")}
    dp = validate({**BASE, "model": {"kind": "gmm_dp", "n_components": 20, "n_features": 2}})["model"]
    assert dp["mean_precision"] == 0.1 and dp["weight_concentration"] == 1.0
    model = build_model(dp)
    assert model.mean_precision == 0.1 and model.weight_concentration == pytest.approx(1.0 / 20)
    hmm = validate({**BASE, "model": {"kind": "hmm", "n_components": 3, "n_symbols": 4}})["model"]
    assert hmm["n_components"] == 3 and "n_states" not in hmm and build_model(hmm).n_states == 3


def test_every_setting_is_checked_at_load():
    with pytest.raises(ConfigError, match="inference.n_total: must be > 0"):
        validate({**BASE, "inference": {"n_total": 0}, "model": {"kind": "pmf"}})
    # a rule between two settings, the model's own: refused at load too
    with pytest.raises(ConfigError, match="degrees_of_freedom must be > n_features - 1 = 2"):
        validate({**BASE, "model": {"kind": "gmm", "n_components": 2, "n_features": 3,
                                    "degrees_of_freedom": 1.5}})
    # the engine's own rules too
    with pytest.raises(ConfigError, match="inference.rank: required with covariance = 'lowrank'"):
        validate({**BASE, "inference": {"n_total": 10, "covariance": "lowrank"},
                  "model": {"kind": "logistic", "n_features": 3}})
    with pytest.raises(ConfigError, match="source.codec: 'text' is not a codec of 'ratings' records"):
        validate({**BASE, "source": {"kind": "file", "path": "x", "codec": "text"}, "model": {"kind": "pmf"}})


def test_record_kinds_declare_their_settings():
    from streamsvi.io.bow import BowBinaryCodec
    from streamsvi.io.records import KINDS

    lda = {"kind": "lda", "n_components": 2, "n_features": 5}
    cfg = validate({**BASE, "model": lda, "records": {"count_dtype": "uint32"}})
    assert cfg["records"] == {"count_dtype": "uint32"}
    codec = KINDS["bow"].make_codec("binary", build_model(cfg["model"]), {**cfg["source"], **cfg["records"]})
    assert isinstance(codec, BowBinaryCodec) and codec.dtype == "uint32"
    assert validate({**BASE, "model": lda})["records"] == {"count_dtype": "float64"}
    with pytest.raises(ConfigError, match="records.count_dtype: must be one of 'float64', 'float32', "
                                          "'uint32', got 'int8'"):
        validate({**BASE, "model": lda, "records": {"count_dtype": "int8"}})
    with pytest.raises(ConfigError, match="records: 'ratings' records .* have no settings"):
        validate({**BASE, "model": {"kind": "pmf"}, "records": {"count_dtype": "uint32"}})


def test_annealing_kinds_come_from_the_capability_types():
    from streamsvi.models import PMF, BayesianGMM, RandomRestart, Tempered

    assert issubclass(BayesianGMM, Tempered) and issubclass(BayesianGMM, RandomRestart)
    assert BayesianGMM.annealing_kinds == ("none", "svi+", "deterministic", "stochastic")
    assert not issubclass(PMF, Tempered) and PMF.annealing_kinds == ("none", "svi+")


def test_io_does_not_import_models():
    for path in (PKG / "io").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and n.module and "models" in n.module.split("."):
                # doctest examples import models inside docstrings, which are not code
                pytest.fail(f"{path.name}:{n.lineno} imports {n.module}")
