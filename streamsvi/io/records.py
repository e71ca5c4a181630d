"""Record kinds: how one model family's records travel from bytes to a minibatch.

The I/O layer (sources, dead letters, the daemon's held-out reservoir) does not
know what a record is. A :class:`RecordKind` tells it, for one family of
models:

* which codecs exist (``codec_names``) and how to build one for a model
  (:meth:`RecordKind.make_codec`);
* how to validate decoded records for a model (:meth:`RecordKind.make_validator`);
* how to count, slice and join decoded records (:meth:`n_records`,
  :meth:`take`, :meth:`concat`, :meth:`empty`);
* how to write records as JSON values and read them back
  (:meth:`to_json`, :meth:`from_json`), used for dead letters from the memory
  source and for the held-out reservoir stored in every snapshot.

A *part* is whatever the kind's codecs return: a dense ``(n, D)`` float array
for the Gaussian mixtures, a CSR matrix for bag-of-words, and so on. A batch
is a part, and it is what the model's ``check_batch`` receives; the engine
only needs ``batch.shape[0]`` and ``batch[int_array]``.

Codec protocol (see :class:`streamsvi.io.codecs.Codec`):

``rows_per_message``  1 for one-record-per-message codecs, ``None`` otherwise
``decode_rows(payload) -> part``  raises :class:`~streamsvi.io.codecs.DecodeError`
``decode_many(payloads) -> part | None``  every payload at once, or ``None``
    when that is not possible (the caller then decodes one by one)
``encode_rows(part) -> bytes``  the inverse of ``decode_rows``
``get_params() -> dict``
``empty() -> part``  a part with no records (kinds other than dense)

Validator protocol (see :class:`streamsvi.io.dense.RecordValidator`):

``max_message_bytes``; ``check_size(payload) -> (reason, message) | None``;
``validate(part) -> (good_part, [(row, reason, message), ...])``;
``all_valid(part) -> bool``

Each kind lives in one module with its codecs and validator, and registers
itself here with :func:`register_kind` when imported: ``"dense"``
(:mod:`streamsvi.io.dense`), ``"bow"`` (:mod:`streamsvi.io.bow`),
``"sequences"`` (:mod:`streamsvi.io.sequences`), ``"ratings"``
(:mod:`streamsvi.io.ratings`). The package :mod:`streamsvi.io` imports them
all, so importing anything from it fills :data:`KINDS`. This module imports
none of them.
"""
from __future__ import annotations

from typing import Sequence

from ..settings import Setting

__all__ = ["RecordKind", "record_kind", "kind_named", "register_kind", "KINDS"]


class RecordKind:
    """Interface; see the module docstring."""

    #: short name (used in messages and docs)
    name = "abstract"
    #: codec names accepted by ``make_codec`` (the config's ``source.codec``)
    codec_names: tuple[str, ...] = ()
    #: the kind's own settings (:mod:`streamsvi.settings`): the config's ``[records]`` table,
    #: checked and filled by ``service/config.py`` and passed to :meth:`make_codec` with the
    #: ``[source]`` section
    settings: dict[str, Setting] = {}

    def n_fields(self, model) -> int | None:
        """How many names ``source.fields`` takes for ``model`` (JSON objects in field order);
        None: records are not read by field names."""
        return model.n_features

    def make_codec(self, name: str, model, options: dict):
        """A codec for ``model``'s records. ``options`` is the config's ``source`` section."""
        raise NotImplementedError

    def make_validator(self, model, options: dict):
        """A validator for ``model``. ``options`` is the config's ``validation`` section."""
        raise NotImplementedError

    def n_records(self, part) -> int:
        return int(part.shape[0])

    def take(self, part, index):
        """Records ``index`` (a slice or an integer array) of ``part``."""
        return part[index]

    def concat(self, parts: Sequence):
        raise NotImplementedError

    def empty(self, model):
        """A part holding no records."""
        raise NotImplementedError

    def to_json(self, part) -> list:
        """One JSON-serialisable value per record."""
        raise NotImplementedError

    def from_json(self, values: list, model):
        """Inverse of :meth:`to_json`."""
        raise NotImplementedError


#: kind name -> RecordKind instance
KINDS: dict[str, RecordKind] = {}


def register_kind(kind: RecordKind) -> RecordKind:
    """Add ``kind`` to :data:`KINDS` under ``kind.name`` (each kind's module calls it once)."""
    KINDS[kind.name] = kind
    return kind


def record_kind(model) -> RecordKind:
    """The record kind of ``model``: its class's ``record_kind`` (``streamsvi.models.base.Model``)."""
    return kind_named(model.record_kind, model.name)


def kind_named(name: str, model_name: str = "?") -> RecordKind:
    """The registered record kind ``name`` (``ValueError`` naming the model that asked for it)."""
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"model {model_name!r} names an unknown record kind "
                         f"{name!r}; known: {sorted(KINDS)}") from None
