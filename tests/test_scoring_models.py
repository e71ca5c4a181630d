"""Scores of every model: ``fitted.score``, ``fitted.score_block`` and ``streamsvi score`` agree
with the model's own methods, for every registered model kind (issue 26, item 1)."""
import itertools
import json

import numpy as np
import pytest

import streamsvi
from streamsvi.checkpoint import CheckpointStore
from streamsvi.cli import main
from streamsvi.inference import SVI, GradientVI
from streamsvi.io.records import record_kind
from streamsvi.models import MODELS, BayesianLogisticRegression, GradientModel, SoftmaxRegression
from streamsvi.models.base import records_of_columns, rounded_probabilities
from streamsvi.scoring import LineScorer, jsonl_of_columns
from tests.conftest import MODEL_CASES


def _labelled(n_classes, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 3))
    if n_classes == 2:
        y = (X @ [1.5, -1.0, 0.5] + 0.5 * rng.normal(size=300) > 0).astype(float)
    else:
        y = (X @ rng.normal(size=(3, n_classes)) + 0.5 * rng.normal(size=(300, n_classes))).argmax(1)
    return np.column_stack([X, y])


CASES = dict(MODEL_CASES)
CASES["logistic"] = lambda: (BayesianLogisticRegression(n_features=3), _labelled(2))
CASES["softmax"] = lambda: (SoftmaxRegression(n_features=3, n_classes=3), _labelled(3))


def _fitted(tmp_path, case, steps=3):
    model, X = CASES[case]()
    kind = record_kind(model)
    n = kind.n_records(X)
    engine = GradientVI(model, n_total=n) if isinstance(model, GradientModel) else SVI(model, n_total=n)
    state = engine.init(X, seed=0)
    for _ in range(steps):
        state, _ = engine.update(state, X)
    CheckpointStore(tmp_path).save(engine, state, offsets=[])
    return streamsvi.load(tmp_path), engine, state, X


def test_every_config_kind_has_a_scoring_case():
    kinds = {cls.name for cls in MODELS.values() if cls.config_kinds}
    assert kinds <= {f()[0].name for f in CASES.values()}


def _close(a, b):
    """JSON values equal, floats to 1e-9 relative (a block and a single record may round apart)."""
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(_close, a, b))
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return a == b


def _expected(fitted, part):
    """The scores computed directly from the model's own methods, as dicts."""
    m, lam, aux = fitted.model, fitted.lam, fitted.aux
    name = m.name
    n = record_kind(m).n_records(part)
    if name in ("gmm", "gauss1d", "poisson_mixture"):
        R = m.responsibilities(lam, part)
        return [{"assignment": int(m.predict(lam, part)[i]), "responsibilities": rounded_probabilities(R[i]).tolist(),
                 "log_density": float(m.predictive_logpdf(lam, part)[i])} for i in range(n)]
    if name == "lda":
        theta = m.topic_proportions(lam, part)
        bound = m.predictive_logpdf(lam, part)
        words = np.asarray(part.sum(axis=1)).ravel()
        return [{"topic": int(theta[i].argmax()), "topic_proportions": rounded_probabilities(theta[i]).tolist(),
                 "log_bound": float(bound[i]), "perword_bound": float(bound[i] / words[i])} for i in range(n)]
    if name == "hmm":
        ll, lp, paths = m.log_likelihood(lam, part), m.predictive_logpdf(lam, part), m.viterbi(lam, part)
        return [{"log_likelihood": float(ll[i]), "log_predictive": float(lp[i]), "viterbi": paths[i].tolist()}
                for i in range(n)]
    if name in ("logistic", "softmax"):
        P = m.predict_proba(lam, part[:, :-1])
        P = np.column_stack([1 - P, P]) if P.ndim == 1 else P
        lp = m.predictive_logpdf(lam, part)
        return [{"proba": rounded_probabilities(P[i]).tolist(), "prediction": int(P[i].argmax()),
                 "log_density": float(lp[i])} for i in range(n)]
    if name == "pmf":
        mean, var = m.predict_rating(lam, part.user, part.item, aux=aux)
        lp = m.predictive_logpdf(lam, part, aux=aux)
        return [{"user": part.user[i], "item": part.item[i], "prediction": float(mean[i]),
                 "sd": float(np.sqrt(var[i])), "log_density": float(lp[i])} for i in range(n)]
    if name == "hpf":
        mean = m.predict_rate(lam, part.user, part.item, aux=aux)
        _, sd = m.predict_count(lam, part.user, part.item, aux=aux)
        lp = m.predictive_logpdf(lam, part, aux=aux)
        return [{"user": part.user[i], "item": part.item[i], "prediction": float(mean[i]), "sd": float(sd[i]),
                 "log_density": float(lp[i])} for i in range(n)]
    raise AssertionError(f"no expected scores for {name}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_score_and_cli_match_the_models_methods(tmp_path, case, capsys):
    fitted, _, _, X = _fitted(tmp_path / "ck", case)
    kind = record_kind(fitted.model)
    part = kind.take(X, np.arange(6))
    expected = _expected(fitted, part)
    assert _close(fitted.score(part), expected)
    values = kind.to_json(part)
    if all(isinstance(v, dict) for v in values):          # JSON records straight into fitted.score
        assert _close(fitted.score(values), expected)
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(v) + "\n" for v in values))
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl")]) == 0
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert _close(out, [{"line": i + 1, **e} for i, e in enumerate(expected)])
    assert len(repr(fitted).splitlines()) <= 4 and len(repr(fitted)) < 600


@pytest.mark.parametrize("case", sorted(CASES))
def test_block_path_equals_the_per_line_path_with_bad_lines(tmp_path, case):
    """The same lines scored as one block (all good), one by one, and mixed with bad lines:
    the same values; a bad line gets the daemon's reason code and its line number."""
    fitted, _, _, X = _fitted(tmp_path, case)
    kind = record_kind(fitted.model)
    lines = [json.dumps(v) for v in kind.to_json(kind.take(X, np.arange(40)))]
    scorer = LineScorer(fitted, "jsonl")
    block = [json.loads(t) for t in scorer.score_bytes(list(range(1, 41)), [s.encode() for s in lines])[0]
             .decode().splitlines()]
    per_line = [r for i, s in enumerate(lines, 1) for r in scorer([(i, s)])]
    assert _close(block, per_line)
    assert _close(block, scorer(list(enumerate(lines, 1))))
    mixed = lines[:10] + ["{not json", ""] + lines[10:20] + ["[]"]
    text, ok, bad = scorer.score_bytes([i for i, s in enumerate(mixed, 1) if s],
                                       [s.encode() for s in mixed if s])
    got = [json.loads(t) for t in text.decode().splitlines()]
    assert (ok, bad) == (20, 2)
    assert [r["line"] for r in got] == [i for i, s in enumerate(mixed, 1) if s]
    assert got[10]["line"] == 11 and got[10]["reason"] == "json_invalid"
    offsets = scorer.score_bytes([i + 100 for i, s in enumerate(mixed, 1) if s], [s.encode() for s in mixed if s],
                                 key="offset")[0]
    assert [{"line": r["offset"] - 100, **{k: v for k, v in r.items() if k != "offset"}}
            for r in map(json.loads, offsets.decode().splitlines())] == got
    empty = {"hmm": "empty_sequence", "lda": "empty_document"}.get(case, "wrong_shape")   # the daemon's codes
    assert got[-1]["line"] == 23 and got[-1]["reason"] == empty
    assert _close([r for r in got if "error" not in r], [{**r, "line": r["line"] + (2 if r["line"] > 10 else 0)}
                                                         for r in block[:20]])


@pytest.mark.parametrize("case", ["pmf", "hpf"])
def test_ratings_without_a_rating_and_top_k_leave_out_rated_items(tmp_path, case, capsys):
    fitted, engine, state, x = _fitted(tmp_path / "ck", case)
    model, lam, aux = fitted.model, fitted.lam, fitted.aux
    user = x.user[0]
    rated = set(x.item[x.user == user])
    lines = [{"user": user, "item": x.item[1]}, {"user": user}, {"user": "nobody", "item": "nothing"},
             {"user": user, "item": x.item[1], "rating": 2}, {"item": x.item[1]}, {"user": user, "rating": 2}]
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(v) + "\n" for v in lines))
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--top-k", "4"]) == 1
    out = [json.loads(t) for t in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert _close(out, [{"line": i + 1, **r} for i, r in enumerate(fitted.score(lines, top_k=4))])
    predict = model.predict_rating if case == "pmf" else model.predict_rate
    m = predict(lam, [user], [x.item[1]], aux=aux)
    m = m[0] if case == "pmf" else m
    assert set(out[0]) == {"line", "user", "item", "prediction", "sd"}          # unrated: no density
    assert out[0]["prediction"] == pytest.approx(float(m[0]), rel=1e-12) and out[0]["sd"] > 0
    # top-k: the unrated items by predicted score, best first (brute force), none the user rated
    scores = {j: float(np.ravel(predict(lam, [user], [j], aux=aux))[0]) for j in aux["items"] if j not in rated}
    best = sorted(scores, key=lambda j: -scores[j])[:4]
    assert [r["item"] for r in out[1]["top_k"]] == best and not rated & set(best)
    assert out[1]["top_k"][0]["prediction"] == pytest.approx(scores[best[0]], rel=1e-9)
    # unknown user and item: the prior's prediction (cold start), not an error
    prior = predict(lam, ["nobody"], ["nothing"], aux=aux)
    prior = prior[0] if case == "pmf" else prior
    assert out[2]["prediction"] == pytest.approx(float(prior[0]), rel=1e-12)
    # with a rating: the log density as the model computes it
    from streamsvi.models import Ratings
    lp = model.predictive_logpdf(lam, Ratings([user], [x.item[1]], [2.0]), aux=aux)
    assert out[3]["log_density"] == pytest.approx(float(lp[0]), rel=1e-12)
    assert out[4]["reason"] == "missing_field" and out[5]["reason"] == "missing_field"


def test_learning_still_dead_letters_a_rating_record_without_its_rating():
    from streamsvi.io.codecs import DecodeError
    kind = record_kind(CASES["pmf"]()[0])
    codec = kind.make_codec("json", CASES["pmf"]()[0], {})
    with pytest.raises(DecodeError) as err:
        codec.decode_rows(b'{"user": "u1", "item": 3}')
    assert err.value.reason == "missing_field"
    assert codec.decode_many([b'{"user": "u1", "item": 3}']) is None


def test_scoring_refuses_a_given_nan_rating_as_the_daemon_does(tmp_path):
    fitted, *_ = _fitted(tmp_path, "pmf")
    out = LineScorer(fitted, "jsonl")([(1, '{"user": "u1", "item": 3, "rating": NaN}'),
                                       (2, '{"user": "u1", "item": 3, "rating": 1e400}')])
    assert [r["reason"] for r in out] == ["non_finite", "non_finite"]


def test_viterbi_states_are_the_brute_force_argmax_on_a_tiny_hmm(tmp_path):
    fitted, *_ = _fitted(tmp_path, "hmm")
    pi, A, B = fitted.model.mean_params(fitted.lam)
    K = fitted.model.n_states
    rng = np.random.default_rng(3)
    seqs = [rng.integers(0, B.shape[1], L).tolist() for L in (1, 2, 4, 5)]
    got = fitted.score([s for s in seqs])
    for s, rec in zip(seqs, got):
        def logp(path):
            return (np.log(pi[path[0]]) + sum(np.log(A[a, b]) for a, b in zip(path, path[1:]))
                    + sum(np.log(B[z, o]) for z, o in zip(path, s)))
        paths = list(itertools.product(range(K), repeat=len(s)))
        lps = np.array([logp(p) for p in paths])
        assert rec["viterbi"] == list(paths[int(lps.argmax())])
        assert rec["log_likelihood"] == pytest.approx(float(np.logaddexp.reduce(lps)), rel=1e-10)


def test_writer_gives_the_dicts_values_and_exact_float_text():
    rng = np.random.default_rng(0)
    n = 2000
    v = rng.normal(size=n) * 10.0 ** rng.integers(-320, 300, n)
    v[:5] = [0.0, -0.0, 1e16, 1e-5, 123456789.123]
    P = rng.dirichlet(np.full(4, 0.05), n)
    P[0] = [1.0, 0.0, 0.0, 0.0]
    cols = {"k": rng.integers(0, 9, n), "flag": rng.random(n) > 0.5, "p": P,
            "log_density": np.where(rng.random(n) > 0.2, v, np.nan), "ids": [f"é{i}\"" for i in range(n)],
            "plain": ["" if i % 7 == 0 else f"u-{i} x" for i in range(n)],
            "path": [None if i % 3 else [i, {"a": 1.5}] for i in range(n)]}
    text = jsonl_of_columns(cols, np.arange(7, 7 + n))
    lines = text.decode().splitlines()
    assert [json.loads(t) for t in lines] == [{"line": 7 + i, **r} for i, r in enumerate(records_of_columns(cols))]
    got = np.array([json.loads(t)["x"] for t in jsonl_of_columns({"x": v}, np.arange(n)).decode().splitlines()])
    assert got.tobytes() == v.tobytes()               # shortest round-trip text: every float exact, -0.0 too
    assert jsonl_of_columns({"x": v[:2]}, [40, 41], key="offset") == \
        "".join(json.dumps({"offset": 40 + i, "x": x}, separators=(",", ":")) + "\n"
                for i, x in enumerate(v[:2].tolist())).encode()
    inf = {"x": np.array([1.0, np.inf])}                  # ±inf: written record by record, as json.dumps
    assert jsonl_of_columns(inf, [1, 2]) == b'{"line":1,"x":1.0}\n{"line":2,"x":Infinity}\n'


def test_writer_without_orjson_gives_the_same_values(monkeypatch):
    """numpy's float text and the probabilities' digit tables when orjson is not installed."""
    import streamsvi.scoring as scoring
    rng = np.random.default_rng(1)
    n = 500
    cols = {"k": rng.integers(0, 2000, n), "p": rng.dirichlet(np.full(5, 0.1), n),
            "log_density": rng.normal(size=n) * 10.0 ** rng.integers(-30, 30, n)}
    with_orjson = jsonl_of_columns(cols, np.arange(n))
    monkeypatch.setattr(scoring, "_orjson", None)
    without = jsonl_of_columns(cols, np.arange(n))
    assert [json.loads(t) for t in with_orjson.splitlines()] == [json.loads(t) for t in without.splitlines()] \
        == [{"line": i, **r} for i, r in enumerate(records_of_columns(cols))]


def test_integer_text_of_the_digit_tables():
    from streamsvi.scoring import _int_text
    v = np.array([0, 5, 10, 999, 1000, 1001, 100000, 123456, 1000000, 999999999999, 7])
    assert [bytes(r).replace(b"\0", b"").decode() for r in _int_text(v)] == [str(i) for i in v]
    big = np.array([-3, 10 ** 15])                        # beyond the tables: numpy's text
    assert [bytes(r).replace(b"\0", b"").decode() for r in _int_text(big)] == ["-3", str(10 ** 15)]


def _number_texts(rng, k):
    """JSON numbers as producers write them: repr, fixed, exponent, integer, edge cases."""
    out = []
    for _ in range(k):
        r = rng.random()
        if r < 0.3:
            out.append(repr(float(rng.normal() * 10.0 ** rng.integers(-8, 8))))
        elif r < 0.45:
            out.append(str(int(rng.integers(-10 ** 6, 10 ** 6))))
        elif r < 0.6:
            out.append(f"{rng.normal():.{rng.integers(0, 12)}e}".replace("e+", rng.choice(["e+", "E", "e"])))
        elif r < 0.7:
            out.append(str(rng.choice(["-0", "0", "-0.0", "0.0", "1E5", "1e+05", "-2e-3", "9007199254740993",
                                       "123456789012345678901234567890", "5e-324", "1.7976931348623157e308"])))
        else:
            out.append(f"{rng.normal() * 100:.{rng.integers(0, 17)}f}")
    return out


def test_parse_json_rows_reads_what_json_loads_reads_or_refuses():
    from streamsvi.io.codecs import parse_json_rows
    rng = np.random.default_rng(2)
    accepted = 0
    for trial in range(400):
        n, D = int(rng.integers(1, 20)), int(rng.integers(1, 5))
        toks = _number_texts(rng, n * D)
        rows = [str(rng.choice([", ", ","])).join(toks[i * D:(i + 1) * D]) for i in range(n)]
        text = "".join(f"[{r}]\n" for r in rows).encode()
        if trial % 3 == 0:                                  # one byte changed: most are refused
            b = bytearray(text)
            b[int(rng.integers(0, len(b)))] = int(rng.choice(list(b"0123456789-+.eE[], \nx{")))
            text = bytes(b)
        try:
            ref = [json.loads(t) for t in text.split(b"\n")[:-1]]
            ok = len(ref) == n and all(isinstance(r, list) and len(r) == D and
                                       all(type(v) in (int, float) for v in r) for r in ref)
        except ValueError:
            ok = False
        got = parse_json_rows(text, n, D)
        if got is None:
            assert trial % 3 == 0 or not ok, text              # valid rows of numbers are read
            continue
        accepted += 1
        assert ok, text                                       # nothing invalid is read
        expected = np.array([[float(v) for v in r] for r in ref])
        assert got.tobytes() == expected.tobytes(), text      # the same floats, bit for bit
    assert accepted > 250
    for bad in (b"[1, 2]\r\n", b"[1, 2] \n", b"\n[1, 2]\n", b"[1, NaN]\n", b"[1, 2]\n[3]\n", b"[[1], 2]\n",
                b"[1, 2]", b'["1", 2]\n', b"[1 2, 3]\n", b"[1,2],[3,4]\n", b"[1e400, 2]\n"):
        assert parse_json_rows(bad, bad.count(b"\n") or 1, 2) is None, bad


@pytest.mark.parametrize("case", ["gmm", "lda", "pmf"])
def test_score_text_equals_the_per_line_path(tmp_path, case):
    """The one-pass block (all good dense rows) and the line-by-line path give the same lines;
    bad and blank lines keep their numbers and the daemon's reasons."""
    fitted, _, _, X = _fitted(tmp_path, case)
    kind = record_kind(fitted.model)
    lines = [json.dumps(v) for v in kind.to_json(kind.take(X, np.arange(30)))]
    scorer = LineScorer(fitted, "jsonl")
    per_line = [r for i, s in enumerate(lines, 5) for r in scorer([(i, s)])]
    block, ok, bad = scorer.score_text("\n".join(lines).encode(), first=5)   # no final line break
    assert (ok, bad) == (30, 0)
    assert _close([json.loads(t) for t in block.splitlines()], per_line)
    mixed = lines[:10] + ["", "[1, 2", "  "] + lines[10:]
    text, ok, bad = scorer.score_text(("\r\n".join(mixed) + "\r\n").encode(), first=1)
    got = [json.loads(t) for t in text.splitlines()]
    assert (ok, bad) == (30, 1)
    assert [r["line"] for r in got] == [i for i, s in enumerate(mixed, 1) if s.strip()]
    assert got[10]["line"] == 12 and got[10]["reason"] == "json_invalid"
    assert _close([{k: v for k, v in r.items() if k != "line"} for r in got if "error" not in r],
                  [{k: v for k, v in r.items() if k != "line"} for r in per_line])


def test_dense_decode_many_fast_path_equals_one_by_one():
    from streamsvi.io.dense import JsonCodec
    rng = np.random.default_rng(3)
    codec = JsonCodec(3)
    toks = _number_texts(rng, 300)
    payloads = [f"[{', '.join(toks[i:i + 3])}]".encode() for i in range(0, 300, 3)]
    fast = codec.decode_many(payloads)
    assert fast.tobytes() == np.concatenate([codec.decode_rows(p) for p in payloads]).tobytes()
    assert codec.decode_many(payloads[:5] + [b"[1, 2]"]) is None
    assert codec.decode_many([b" [1, 2, 3]", b"[4,5,6]"]).tolist() == [[1, 2, 3], [4, 5, 6]]   # general path


def test_cli_blocks_number_lines_across_blocks_crlf_and_a_last_line_without_a_break(tmp_path):
    """--chunk smaller than the file: numbering runs on across blocks; blank and bad lines, CRLF
    line ends and a last line without a line break get the per-line path's output."""
    fitted, _, _, X = _fitted(tmp_path / "ck", "gmm")
    lines = [json.dumps(r) for r in X[:23].tolist()]
    scorer = LineScorer(fitted, "jsonl")
    expected = scorer(list(enumerate(lines, 1)))
    variants = {"plain": "\n".join(lines) + "\n", "no_final_break": "\n".join(lines),
                "crlf": "\r\n".join(lines) + "\r\n"}
    for name, text in variants.items():
        (tmp_path / "in.jsonl").write_bytes(text.encode())
        assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                     "--output", str(tmp_path / "out.jsonl"), "--chunk", "5"]) == 0, name
        out = [json.loads(t) for t in (tmp_path / "out.jsonl").read_text().splitlines()]
        assert _close(out, expected), name
    mixed = lines[:4] + ["", json.dumps([1.0] * (X.shape[1] + 1))] + lines[4:]   # blank, bad: a block's edge
    (tmp_path / "in.jsonl").write_text("\n".join(mixed) + "\n")
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--chunk", "5"]) == 1
    out = [json.loads(t) for t in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["line"] for r in out] == [i for i, s in enumerate(mixed, 1) if s]
    assert out[4]["line"] == 6 and out[4]["reason"] == "wrong_shape"
    assert _close([{k: v for k, v in r.items() if k != "line"} for r in out if "error" not in r],
                  [{k: v for k, v in r.items() if k != "line"} for r in expected])


@pytest.mark.parametrize("case", sorted(CASES))
def test_cli_scores_writes_only_the_named_columns_in_their_order(tmp_path, case, capsys):
    """``--scores`` keeps the named columns of the full output, in the order named, for every model;
    a name the model does not give is refused with the names it gives."""
    fitted, _, _, X = _fitted(tmp_path / "ck", case)
    kind = record_kind(fitted.model)
    part = kind.take(X, np.arange(6))
    (tmp_path / "in.jsonl").write_text("".join(json.dumps(v) + "\n" for v in kind.to_json(part)))
    full = _expected(fitted, part)
    names = list(full[0])[::-1][:2]                       # two columns, the order reversed
    assert set(fitted.score_block(part)) <= set(fitted.score_column_names)     # the names are declared
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--output", str(tmp_path / "out.jsonl"), "--scores", ",".join(names)]) == 0
    out = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [list(r) for r in out] == [["line", *names]] * 6
    assert _close(out, [{"line": i + 1, **{k: e[k] for k in names}} for i, e in enumerate(full)])
    capsys.readouterr()
    assert main(["score", "--snapshot", str(tmp_path / "ck"), "--input", str(tmp_path / "in.jsonl"),
                 "--scores", "no_such_score"]) == 2
    assert "no_such_score" in capsys.readouterr().err


def test_a_mixture_asked_for_its_density_computes_only_the_density(tmp_path, monkeypatch):
    fitted, _, _, X = _fitted(tmp_path / "ck", "gmm")
    monkeypatch.setattr(type(fitted.model), "responsibilities",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("computed")))
    cols = fitted.score_block(X[:5], columns=("log_density",))
    assert list(cols) == ["log_density"]
    assert np.array_equal(cols["log_density"], fitted.model.predictive_logpdf(fitted.lam, X[:5]))
