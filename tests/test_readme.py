"""The README's first screen, its code blocks and its links into the docs stay true."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_first_screen_has_exactly_two_setup_commands():
    text = README.read_text()
    first = re.search(r"```bash\n(.*?)```", text, re.S).group(1).strip().splitlines()
    assert len(first) == 2
    assert first[0].startswith("pip install -e '.[local]' && streamsvi demo")
    assert first[1].startswith("pip install -e '.[test]' && python -m pytest")
    assert text.index("```bash") < 1200     # on the first screen


def test_front_page_is_short():
    assert len(README.read_text().splitlines()) <= 300


def runnable_blocks(path: Path) -> list[str]:
    """Python blocks of a Markdown file, except those marked ``<!-- illustrative ... -->`` just above."""
    return [m.group(2) for m in re.finditer(r"(<!-- illustrative[^>]*-->\n)?```python\n(.*?)```",
                                           path.read_text(), re.S) if not m.group(1)]


@pytest.mark.parametrize("i", range(len(runnable_blocks(README))))
def test_python_blocks_run(i, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    block = runnable_blocks(README)[i]
    exec(compile(block, f"README.md block {i}", "exec"), {})


def github_anchors(path: Path) -> set[str]:
    """The anchors GitHub makes of a Markdown file's headings (outside code blocks)."""
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for m in re.finditer(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", m.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_resolve():
    """Every relative link of the README names an existing file and, where given, a heading in it."""
    text = re.sub(r"^```.*?^```", "", README.read_text(), flags=re.S | re.M)
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    into_docs = [t for t in links if t.startswith("docs/")]
    assert len(into_docs) >= 10, links
    for target in links:
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = ROOT / file if file else README
        assert path.is_file(), f"README links to {target}: no file {path}"
        if anchor:
            assert anchor in github_anchors(path), f"README links to {target}: no heading #{anchor} in {file}"


def test_link_check_can_fail(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("# Delivery contract\n\n## Exit codes: the table\n```\n# not a heading\n```\n")
    assert github_anchors(page) == {"delivery-contract", "exit-codes-the-table"}
