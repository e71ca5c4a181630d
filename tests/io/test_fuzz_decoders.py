"""Property-based fuzzing of every decoder (issue 30, item 2).

For every record kind and every codec (JSON, binary, text, CSV), fed
arbitrary bytes, arbitrary JSON values (huge and non-finite numbers, deep
nesting, wrong types, invalid UTF-8) and binary messages with a valid header
and random fields:

* the codec yields a part or raises :class:`DecodeError` with a named reason,
  and never anything else (``codec_error`` would mean a decoder defect);
* the validator accounts for every decoded record (kept, or rejected with a
  reason), and never raises;
* the source's batch builder takes any mix of such messages with valid ones:
  every message is accounted for (valid records kept, the rest dead-lettered
  with a named reason), and it never raises;
* ``streamsvi score``'s line scorer scores the valid lines and reports the
  others, one output per line.

The example budget is fixed and derandomized in CI (``STREAMSVI_FUZZ_EXAMPLES``,
default 150 per property). A longer run on demand::

    STREAMSVI_FUZZ_EXAMPLES=20000 python -m pytest tests/io/test_fuzz_decoders.py -q
"""
import json
import math
import os
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamsvi.io.bow import BowKind
from streamsvi.io.codecs import DecodeError
from streamsvi.io.dense import CsvCodec, DenseKind
from streamsvi.io.labelled import LabelledKind
from streamsvi.io.ratings import RatingsKind
from streamsvi.io.sequences import SequencesKind
from streamsvi.io.sources.base import _BatchBuilder
from streamsvi.models import LDA, PMF, BayesianGMM, DiscreteHMM
from streamsvi.models.logistic import BayesianLogisticRegression

EXAMPLES = int(os.environ.get("STREAMSVI_FUZZ_EXAMPLES", "150"))
FUZZ = settings(max_examples=EXAMPLES, derandomize=EXAMPLES <= 1000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Reasons that mean a decoder or validator defect (a named, but unforeseen, failure).
DEFECTS = {"codec_error", "validator_error"}


def _cases():
    """(id, kind, model, codec name, options): every kind and codec the daemon reads."""
    gmm, lda, hmm = BayesianGMM(2, 3), LDA(n_components=2, n_features=50), DiscreteHMM(2, 4)
    logit, pmf = BayesianLogisticRegression(n_features=3), PMF(n_factors=2)
    return [
        ("dense-json", DenseKind(), gmm, "json", {}),
        ("dense-json-fields", DenseKind(), gmm, "json", {"fields": ["a", "b", "c"]}),
        ("dense-binary", DenseKind(), gmm, "binary", {}),
        ("bow-json", BowKind(), lda, "json", {}),
        ("bow-binary", BowKind(), lda, "binary", {}),
        ("bow-text", BowKind(), lda, "text", {}),
        ("sequences-json", SequencesKind(), hmm, "json", {}),
        ("sequences-binary", SequencesKind(), hmm, "binary", {}),
        ("labelled-json", LabelledKind(), logit, "json", {}),
        ("labelled-binary", LabelledKind(), logit, "binary", {}),
        ("ratings-json", RatingsKind(), pmf, "json", {}),
        ("ratings-binary", RatingsKind(), pmf, "binary", {}),
    ]


CASES = _cases()
IDS = [c[0] for c in CASES]

# ------------------------------------------------------------- strategies
KEYS = ["ids", "counts", "x", "y", "symbols", "user", "item", "rating", "a", "b", "c"]
HUGE = [10 ** 30, -(10 ** 30), 2 ** 63, 2 ** 63 - 1, -(2 ** 63) - 1, 2 ** 64, 2 ** 32, 2 ** 31, 2 ** 53 + 1,
        1e300, -1e300, 1e308, 5e-324, 0.5, -0.0, 3.0, 1.0]
scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.sampled_from(HUGE),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8))
json_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=6),
    st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), inner, max_size=5)),
    max_leaves=25)


def _dumps(v) -> bytes:
    return json.dumps(v, allow_nan=True).encode()


#: Deep nesting and other texts no dumps produces.
ODD = [b"[" * 5000 + b"]" * 5000, b"[" * 100000, b'{"ids": ' + b"[" * 3000 + b"]" * 3000 + b"}",
       b"\xff\xfe\x00", b"\xed\xa0\x80", b"[1e999999]", b"[-1e999999]", b'{"ids": [1e400]}',
       b'"\\ud800"', b"NaN", b"[Infinity, -Infinity, NaN]", b"", b" ", b"\x00" * 20, b"null", b"[]", b"{}"]


def _header(magic, version, fmt_rest, fields):
    return struct.pack("<4sB" + fmt_rest, magic, version, *fields)


@st.composite
def binary_messages(draw):
    """A header with a known magic and version and random fields, then random bytes."""
    magic = draw(st.sampled_from([b"SSVB", b"SSVW", b"SSVQ", b"SSVR"]))
    head = magic + bytes([1]) + draw(st.binary(min_size=11, max_size=15))
    n_body = draw(st.integers(0, 96))
    return head + draw(st.binary(min_size=n_body, max_size=n_body))


number_lists = st.lists(st.one_of(st.integers(0, 60), scalars), min_size=1, max_size=5)
#: Records of the right shape for each kind with odd values inside: what gets past the shape checks.
shaped = st.one_of(
    number_lists,                                                            # dense, sequences, bow ids
    st.fixed_dictionaries({"ids": number_lists}, optional={"counts": number_lists}),   # bow
    st.fixed_dictionaries({"symbols": number_lists}),                        # sequences
    st.fixed_dictionaries({"x": st.lists(scalars, min_size=3, max_size=3), "y": scalars}),   # labelled
    st.fixed_dictionaries({"a": scalars, "b": scalars, "c": scalars}),       # dense with fields
    st.fixed_dictionaries({"user": scalars, "item": scalars, "rating": scalars}),   # ratings
).map(_dumps)

payloads = st.one_of(st.binary(max_size=120), json_values.map(_dumps), st.sampled_from(ODD),
                     binary_messages(), shaped, shaped,
                     # near-valid: a valid record's JSON with one value replaced
                     st.tuples(st.sampled_from(KEYS), json_values).map(lambda kv: _dumps({kv[0]: kv[1]})))


def _valid_payloads(kind, model, codec, n=3, seed=0):
    """Messages that must be accepted: real records of the kind, encoded by the codec."""
    rng = np.random.default_rng(seed)
    if isinstance(kind, BowKind):
        docs = [{"ids": rng.choice(50, 4, replace=False).tolist(), "counts": [1, 2, 1, 3]} for _ in range(n)]
        if codec.name == "text":
            return [b"apple banana cherry date" for _ in range(n)]
        part = kind.from_json(docs, model)
    elif isinstance(kind, SequencesKind):
        part = kind.from_json([rng.integers(0, 4, 5).tolist() for _ in range(n)], model)
    elif isinstance(kind, LabelledKind):
        part = np.column_stack([rng.normal(size=(n, 3)), rng.integers(0, 2, n)])
    elif isinstance(kind, RatingsKind):
        part = kind.from_json([{"user": f"u{i}", "item": i, "rating": 3.5} for i in range(n)])
    else:
        part = rng.normal(size=(n, 3))
    if codec.rows_per_message == 1:
        return [codec.encode_rows(kind.take(part, slice(i, i + 1))) for i in range(n)]
    return [codec.encode_rows(part)]


def _decode(codec, payload):
    try:
        return codec.decode_rows(payload), None
    except DecodeError as exc:
        assert exc.reason and exc.reason.replace("_", "").isalpha(), exc.reason
        assert exc.reason not in DEFECTS
        return None, exc.reason


# --------------------------------------------------------------- properties
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_a_codec_yields_records_or_a_named_reason_and_the_validator_accounts_for_them(case):
    _, kind, model, name, options = case
    codec = kind.make_codec(name, model, options)
    validator = kind.make_validator(model, {})

    @FUZZ
    @given(payload=payloads)
    def check(payload):
        part, reason = _decode(codec, payload)
        if part is None:
            return
        n = kind.n_records(part)
        good, rejected = validator.validate(part)
        rows = [i for i, _, _ in rejected]
        assert len(set(rows)) == len(rows) and all(0 <= i < n for i in rows)
        assert kind.n_records(good) + len(rows) == n
        assert all(r and r not in DEFECTS for _, r, _ in rejected)
        assert validator.all_valid(part) == (not rejected)

    check()


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_batch_builder_accounts_for_every_message_of_any_mix(case):
    _, kind, model, name, options = case
    codec = kind.make_codec(name, model, options)
    validator = kind.make_validator(model, {})
    good = _valid_payloads(kind, model, codec)
    n_good = sum(kind.n_records(codec.decode_rows(p)) for p in good)

    @FUZZ
    @given(bad=st.lists(payloads, min_size=1, max_size=6), at=st.integers(0, 6))
    def check(bad, at):
        at = min(at, len(good))
        msgs = good[:at] + bad + good[at:]
        b = _BatchBuilder(codec, validator, getattr(codec, "n_features", None), kind=kind)
        b.add_messages([("t", 0, i, p) for i, p in enumerate(msgs)])
        batch = b.batch()
        assert batch.n_messages == len(msgs) and batch.next_offsets == {("t", 0): len(msgs)}
        assert not [d for d in batch.dead if d.reason in DEFECTS], [(d.reason, d.message) for d in batch.dead]
        # every good record is kept; a bad message is dead-lettered or (by chance) valid records
        assert kind.n_records(batch.x) >= n_good
        dead_offsets = {d.position.offset for d in batch.dead}
        assert all(i in dead_offsets or _decode(codec, msgs[i])[0] is not None for i in range(len(msgs)))
        assert not dead_offsets & set(range(at)) and not dead_offsets & set(range(at + len(bad), len(msgs)))

    check()


def test_the_csv_codec_yields_rows_or_a_named_reason():
    codec = CsvCodec(3)

    @FUZZ
    @given(line=st.one_of(st.binary(max_size=80), st.lists(st.one_of(st.sampled_from(
        ["1", "-2.5", "1e400", "nan", "inf", "", " ", "x", "1" + "0" * 400, '"3"', "0x10"]),
        st.text(max_size=5)), max_size=5).map(lambda xs: ",".join(xs).encode("utf-8", "surrogatepass"))))
    def check(line):
        part, _ = _decode(codec, line)
        assert part is None or part.shape[1] == 3

    check()


# ------------------------------------------------------------------ scoring
def _snapshot(tmp_path, kind, model):
    """A real snapshot of ``model`` after one update on valid records."""
    from streamsvi import SVI
    from streamsvi.checkpoint import CheckpointStore
    from streamsvi.inference.gradients import GradientVI

    engine = GradientVI(model, n_total=100) if isinstance(model, BayesianLogisticRegression) \
        else SVI(model, n_total=100)
    codec = kind.make_codec("json", model, {})
    part = kind.concat([codec.decode_rows(p) for p in _valid_payloads(kind, model, codec, n=20, seed=1)])
    state, _ = engine.update(engine.init(part, seed=0), part)
    CheckpointStore(tmp_path).save(engine, state, [])
    return tmp_path


SCORE_CASES = [c for c in CASES if c[3] == "json" and not c[4]]


@pytest.mark.parametrize("case", SCORE_CASES, ids=[c[0] for c in SCORE_CASES])
def test_the_line_scorer_scores_valid_lines_and_reports_the_others(case, tmp_path):
    import streamsvi
    from streamsvi.scoring import LineScorer

    _, kind, model, name, options = case
    codec = kind.make_codec(name, model, options)
    scorer = LineScorer(streamsvi.load(_snapshot(tmp_path, kind, model)), "jsonl")
    good = [p.decode() for p in _valid_payloads(kind, model, codec, n=3, seed=2)]

    @FUZZ
    @given(bad=st.lists(payloads.map(lambda p: p.decode("utf-8", "replace").replace("\n", " ")),
                        min_size=1, max_size=4))
    def check(bad):
        lines = list(enumerate(good + bad, start=1))
        out = scorer(lines)
        numbered = [n for n, text in lines if text.strip()]
        assert [r["line"] for r in out] == numbered
        assert all("error" not in r for r in out[:len(good)]), out[:len(good)]
        for r in out:
            assert ("error" in r) == ("reason" in r)
            assert r.get("reason") not in DEFECTS, r
            if "error" not in r:
                assert all(not isinstance(v, float) or not math.isnan(v) or k == "log_likelihood"
                           for k, v in r.items())

    check()
