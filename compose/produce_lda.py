"""Bag-of-words documents for the scaled-out LDA example (docker-compose.scaleout.yml).

`streamsvi produce` writes dense rows only (pima, blobs, a CSV), so this script writes LDA's
records with the package's own API: documents drawn from LDA's generative process
(``streamsvi.datasets.make_lda_corpus``, one fixed set of topics for every chunk), one
document per message as JSON ``{"ids": [...], "counts": [...]}`` (``BowJsonCodec``), spread
round-robin over the data topic's partitions (``produce_rows``).

    python compose/produce_lda.py --bootstrap-servers kafka:9092 --topic lda-documents \\
        --partitions 3 --docs 120000 --words 1000

With ``--config FILE`` (a streamsvi config) the brokers and the TLS / SASL settings come from
its ``[source]`` table, as for ``streamsvi produce --config``.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

from streamsvi.datasets import make_lda_corpus
from streamsvi.io import create_topic, produce_rows
from streamsvi.io.bow import BowJsonCodec
from streamsvi.io.records import KINDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap-servers", help="brokers (default: source.bootstrap_servers of --config)")
    p.add_argument("--config", help="a streamsvi config whose [source] brokers and security settings are used")
    p.add_argument("--topic", default="lda-documents")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--docs", type=int, default=120_000, help="documents in all")
    p.add_argument("--chunk", type=int, default=3_000, help="documents drawn and sent at a time")
    p.add_argument("--topics", type=int, default=10, help="true topics of the generating process")
    p.add_argument("--words", type=int, default=1_000, help="vocabulary size V (the config's n_features)")
    p.add_argument("--doc-length", type=float, default=60.0, help="mean words per document")
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    bootstrap, security = args.bootstrap_servers, {}
    if args.config:
        from streamsvi.service.config import client_security, load_config
        src = load_config(args.config)["source"]
        bootstrap, security = bootstrap or src["bootstrap_servers"], client_security(src)
    if not bootstrap:
        print("give --bootstrap-servers or --config", file=sys.stderr)
        return 2
    create_topic(bootstrap, args.topic, partitions=args.partitions, security=security)
    # one β for the whole stream: draw it once, then every chunk's documents from it
    beta = make_lda_corpus(1, n_topics=args.topics, n_words=args.words, seed=args.seed)[2]
    codec, kind, sent, i = BowJsonCodec(args.words), KINDS["bow"], 0, 0
    while sent < args.docs:
        n = min(args.chunk, args.docs - sent)
        X = make_lda_corpus(n, n_topics=args.topics, n_words=args.words, doc_length=args.doc_length,
                            alpha=0.1, seed=args.seed + 1 + i, topics=beta)[0]
        produce_rows(bootstrap, args.topic, X, codec, partitions=args.partitions, kind=kind,
                     security=security)
        sent, i = sent + n, i + 1
    print(f"produced {sent} documents ({args.topics} topics over {args.words} words) to "
          f"{args.topic!r} on {bootstrap}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
