"""The documentation site builds in strict mode, its code runs, its reference pages are current."""
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_readme import runnable_blocks

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))


def _gen_reference():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mkdocs_build_strict(tmp_path):
    """``mkdocs build --strict``: every page in the nav, every internal link and anchor resolves."""
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site"),
                           "--config-file", str(ROOT / "mkdocs.yml")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-5000:]
    assert not re.search(r"^WARNING", out, re.M), out[-5000:]
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()


def test_reference_pages_are_current():
    """The committed reference pages equal what ``python docs/gen_reference.py`` writes now."""
    for path, text in _gen_reference().render().items():
        assert path.is_file(), f"{path} missing: run python docs/gen_reference.py"
        assert path.read_text() == text, f"{path.relative_to(ROOT)} is out of date: run python docs/gen_reference.py"


def test_reference_check_can_fail(monkeypatch):
    """A setting added to a table changes the generated page (so the check above would fail)."""
    from streamsvi.service import config

    gen = _gen_reference()
    before = gen.configuration()
    monkeypatch.setitem(config.SCHEMA["metrics"], "made_up_key", config.Field("int", 1, "a key nobody wrote"))
    assert "`made_up_key`" in gen.configuration() and "`made_up_key`" not in before


_BLOCKS = [(page, i) for page in PAGES for i in range(len(runnable_blocks(page)))]


@pytest.mark.parametrize("page,i", _BLOCKS, ids=[f"{p.relative_to(DOCS)}:{i}" for p, i in _BLOCKS])
def test_python_blocks_run(page, i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = runnable_blocks(page)[i]
    exec(compile(block, f"{page.relative_to(ROOT)} block {i}", "exec"), {})


def test_every_config_key_and_metric_is_documented():
    from streamsvi.io.records import KINDS
    from streamsvi.models import CONFIG_KINDS
    from streamsvi.service.config import ANNEALING, SCHEMA, load_config, model_schema
    from streamsvi.service.metrics import DaemonMetrics

    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *PAGES])
    for section, fields in SCHEMA.items():
        assert f"`[{section}]`" in text
        for key in fields:
            assert f"`{key}`" in text, f"{section}.{key} is documented nowhere"
    for kind, fields in ANNEALING.items():
        for key in fields:
            assert f"`{key}`" in text, f"inference.annealing.{key} ({kind}) is documented nowhere"
    assert "`[records]`" in text
    for rk in KINDS.values():
        for key in rk.settings:
            assert f"`{key}`" in text, f"records.{key} ({rk.name}) is documented nowhere"
    for kind in CONFIG_KINDS:
        assert f'kind = "{kind}"' in text, f"model.kind = {kind!r} is documented nowhere"
        for key in model_schema(kind):
            assert f"`{key}`" in text, f"model.{key} ({kind}) is documented nowhere"
        # each kind has an example config (what `streamsvi init KIND` writes)
        example = next((d / f"{kind}.toml" for d in (ROOT / "configs", ROOT / "streamsvi" / "configs")
                        if (d / f"{kind}.toml").exists()), ROOT / "configs" / f"{kind}.toml")
        assert example.exists(), f"model.kind = {kind!r} has no example config {example}"
        assert load_config(example)["model"]["kind"] == kind, example
    for mf in DaemonMetrics().registry.collect():
        name = mf.name + ("_total" if mf.type == "counter" else "")
        assert f"`{name}" in text, f"metric {name} is documented nowhere"


def test_every_model_kind_has_a_guide():
    from streamsvi.models import CONFIG_KINDS

    guides = "\n".join(p.read_text() for p in (DOCS / "models").glob("*.md"))
    for kind in CONFIG_KINDS:
        assert f"`streamsvi init {kind}`" in guides, f"no model page shows `streamsvi init {kind}`"
