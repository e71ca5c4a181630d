"""The minibatch of ratings: ``Ratings`` (user and item ids, rating values) and the id rule.

A batch type shared by the ratings record kind (:mod:`streamsvi.io.ratings`) and
the models that learn from ratings (:class:`streamsvi.models.PMF`), so that
neither layer imports the other (beside :mod:`streamsvi.sequence_batch`).
"""
from __future__ import annotations

import numpy as np

__all__ = ["Ratings", "canonical_id", "MAX_ID_LENGTH"]

#: longest accepted id (characters)
MAX_ID_LENGTH = 256


def canonical_id(value, what: str = "id") -> str:
    """The canonical form of a user or item id: a non-empty string.

    Integers become their decimal string (so 42 and "42" are the same id);
    strings are kept as given. Booleans, floats, None, empty strings, strings
    longer than 256 characters and strings with control characters are
    rejected with a ``ValueError`` naming the value.

    >>> canonical_id(42), canonical_id("u-7")
    ('42', 'u-7')
    """
    if isinstance(value, str):
        if not value or len(value) > MAX_ID_LENGTH or not value.isprintable():
            raise ValueError(f"{what} id must be a non-empty printable string of at most "
                             f"{MAX_ID_LENGTH} characters, got {value[:40]!r}")
        return value
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return str(int(value))
    raise ValueError(f"{what} id must be a string or an integer, got {type(value).__name__} {value!r}")


def as_ratings(x, what: str) -> "Ratings":
    """``x`` as :class:`Ratings` (or a mapping of user/item/rating columns), with at least one
    record; ``ValueError`` naming ``what`` (e.g. "a PMF batch") otherwise."""
    if not isinstance(x, Ratings):
        try:
            x = Ratings(x["user"], x["item"], x["rating"])
        except (KeyError, TypeError, IndexError):
            raise ValueError(f"{what} must be Ratings or have 'user', 'item' and 'rating' columns, "
                             f"got {type(x).__name__}") from None
    if len(x) == 0:
        raise ValueError(f"{what} must hold at least one record, got 0")
    return x


class Ratings:
    """A minibatch of ratings: ``user`` and ``item`` ids and ``rating`` values.

    The engine needs only ``shape[0]`` and row selection ``x[int_array]``.
    Ids are canonicalised with :func:`canonical_id` (an object array of str).

    >>> x = Ratings([1, "a"], ["m1", 2], [4.0, 3.5])
    >>> len(x), x[np.array([1])].user.tolist(), x.item.tolist()
    (2, ['a'], ['m1', '2'])
    """

    __slots__ = ("user", "item", "rating")

    def __init__(self, user, item, rating, *, _canonical: bool = False):
        rating = np.asarray(rating, dtype=np.float64).reshape(-1)
        if _canonical:
            self.user, self.item = user, item
        else:
            self.user = np.array([canonical_id(u, "user") for u in np.asarray(user, dtype=object).reshape(-1)],
                                 dtype=object)
            self.item = np.array([canonical_id(v, "item") for v in np.asarray(item, dtype=object).reshape(-1)],
                                 dtype=object)
        if not (len(self.user) == len(self.item) == len(rating)):
            raise ValueError(f"user, item and rating must have the same length, got "
                             f"{len(self.user)}, {len(self.item)}, {len(rating)}")
        self.rating = rating

    @property
    def shape(self) -> tuple[int]:
        return (len(self.rating),)

    def __len__(self):
        return len(self.rating)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            index = [int(index)]
        return Ratings(self.user[index], self.item[index], self.rating[index], _canonical=True)

    def __repr__(self):
        return f"Ratings(n={len(self)})"

    def copy(self) -> "Ratings":
        return Ratings(self.user.copy(), self.item.copy(), self.rating.copy(), _canonical=True)

    @classmethod
    def concat(cls, parts) -> "Ratings":
        parts = list(parts)
        if not parts:
            return cls.empty()
        return cls(np.concatenate([p.user for p in parts]), np.concatenate([p.item for p in parts]),
                   np.concatenate([p.rating for p in parts]), _canonical=True)

    @classmethod
    def empty(cls) -> "Ratings":
        return cls(np.empty(0, dtype=object), np.empty(0, dtype=object), np.empty(0), _canonical=True)

    def to_records(self) -> list[dict]:
        """One ``{"user", "item", "rating"}`` dict per rating."""
        return [{"user": u, "item": v, "rating": float(y)}
                for u, v, y in zip(self.user, self.item, self.rating)]
