"""The README's first screen and its code blocks stay true."""
import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def test_first_screen_has_exactly_two_setup_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert len(first) == 2
    assert first[0].startswith("pip install -e . && streamsvi demo")
    assert first[1].startswith("pip install -e '.[test]' && python -m pytest")
    assert text.index("```bash") < 1200     # on the first screen


def _runnable_blocks():
    """Python blocks, except those marked ``<!-- illustrative ... -->`` just above."""
    return [m.group(2) for m in re.finditer(r"(<!-- illustrative[^>]*-->\n)?```python\n(.*?)```",
                                           README.read_text(), re.S) if not m.group(1)]


@pytest.mark.parametrize("i", range(len(_runnable_blocks())))
def test_python_blocks_run(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = _runnable_blocks()[i]
    exec(compile(block, f"README.md block {i}", "exec"), {})


def test_every_config_key_and_metric_is_documented():
    from streamsvi.service.config import SCHEMA
    from streamsvi.service.metrics import DaemonMetrics

    text = README.read_text()
    from streamsvi.io.records import KINDS
    from streamsvi.models import CONFIG_KINDS

    for section, fields in SCHEMA.items():
        assert f"`[{section}]`" in text
        for key in fields:
            assert f"`{key}`" in text, f"{section}.{key} missing from the README"
    # [model]: each kind's settings are documented by its class's table (--print-config shows
    # them) and each kind by its example config configs/<kind>.toml, which the README points to,
    # so that a new model family needs no README edit
    from streamsvi.service.config import load_config

    assert "configs/<kind>.toml" in text
    for kind in CONFIG_KINDS:
        example = README.parent / "configs" / f"{kind}.toml"
        assert example.exists(), f"model.kind = {kind!r} has no example config {example}"
        assert load_config(example)["model"]["kind"] == kind, example
    assert "`[records]`" in text
    for rk in KINDS.values():
        for key in rk.settings:
            assert f"`{key}`" in text, f"records.{key} ({rk.name}) missing from the README"
    for mf in DaemonMetrics().registry.collect():
        name = mf.name + ("_total" if mf.type == "counter" else "")
        assert f"`{name}" in text, f"metric {name} missing from the README"
