"""The example configs, shipped inside the package (``streamsvi init KIND`` writes one).

One TOML file per example in ``configs/`` (package data): every model kind a
config can name, and ``gmm_binary`` (the binary batch codec). Each points at a
broker on 127.0.0.1:9092, has a metrics port of its own, and keeps its
snapshots under ``var/`` next to the config file. The repository's top-level
``configs/`` is a link to this folder.

Examples
--------
>>> "lda" in example_names() and "gmm_binary" in example_names()
True
>>> example_text("lda").startswith("# LDA topic model")
True
"""
from __future__ import annotations

import importlib.resources

__all__ = ["example_names", "example_text"]


def _folder():
    return importlib.resources.files(__name__).joinpath("configs")


def example_names() -> list[str]:
    """The names of the example configs (the file names without ``.toml``), sorted."""
    return sorted(p.name[:-len(".toml")] for p in _folder().iterdir() if p.name.endswith(".toml"))


def example_text(name: str) -> str:
    """The text of example config ``name``.

    Raises
    ------
    ValueError
        If there is no example of that name, listing the names there are.
    """
    names = example_names()
    if name not in names:
        raise ValueError(f"no example config {name!r}; the examples are: {', '.join(names)}")
    return _folder().joinpath(f"{name}.toml").read_text(encoding="utf-8")
