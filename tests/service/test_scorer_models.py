"""The scorer role gives every model's scores (the issue's table): for each model kind, records on a
topic come back on the output topic with the same scores ``fitted.score`` gives them (mixtures,
LDA, the HMM, logistic and softmax regression, Poisson factorisation; the GMM and PMF have tests
of their own in test_scorer.py)."""
import io
import json

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from streamsvi.io.records import record_kind
from streamsvi.service.config import model_schema, validate
from streamsvi.service.roles.scorer import Scorer
from tests.test_scoring_models import _close, _fitted

from .conftest import gmm_config, produce_raw
from .test_scorer import _by_position, read_committed

CASES = ["lda", "hmm", "logistic", "softmax", "poisson_mixture", "hpf"]


def _model_section(model) -> dict:
    """The ``[model]`` table of the snapshot's model (its settings the config takes; the HMM's
    states are ``n_components`` there)."""
    schema, params = model_schema(model.name), model.get_params()
    out = {"kind": model.name, **{k: v for k, v in params.items() if k in schema and v is not None}}
    if model.name == "hmm":
        out["n_components"] = params["n_states"]
    return out


@pytest.mark.parametrize("case", CASES)
def test_the_scorer_gives_each_models_scores(kafka_broker, new_topic, new_group, tmp_path, case):
    fitted, _, _, X = _fitted(tmp_path / "ck", case)
    kind = record_kind(fitted.model)
    values = kind.to_json(kind.take(X, np.arange(8)))
    if case in ("logistic", "softmax"):          # rows to classify: the label left out
        values = [{"x": v[:-1]} if isinstance(v, list) else {k: w for k, w in v.items() if k != "y"}
                  for v in values]
    bootstrap = kafka_broker.bootstrap
    records, output = new_topic(1), new_topic(1)
    where = produce_raw(bootstrap, records, [json.dumps(v).encode() for v in values], partitions=1)
    raw = gmm_config(tmp_path, bootstrap=bootstrap, topic=records, group=new_group(),
                     inference={"max_wait_seconds": 0.3})
    raw["model"] = _model_section(fitted.model)
    del raw["inference"]["effective_batch_size"]
    raw["metrics"] = {"enabled": False, "progress_seconds": 0.0}
    raw["checkpoint"]["directory"] = str(tmp_path / "ck")
    raw["scorer"] = {"output_topic": output, "scorer_id": "s1", "snapshot_poll_seconds": 0.05}
    cfg = validate(raw)
    res = Scorer(cfg, registry=CollectorRegistry(), out=io.StringIO()).run(until_drained=True, timeout=60)
    got = _by_position(read_committed(bootstrap, output, expect=len(values)))
    expect = fitted.score(values)
    assert (res.records, res.dead) == (len(values), 0), [r.get("error") for r in got.values()]
    for (p, o), want in zip(where, expect):
        r = got[(records, p, o)]
        assert r["snapshot"]["number"] == fitted.number and r["offset"] == o
        assert _close(r["scores"], want), (case, r, want)
