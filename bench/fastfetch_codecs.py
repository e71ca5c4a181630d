"""Records/s of the lean reader (streamsvi.io._fastfetch) against kafka-python's own reader,
per compression, bare (no decoding): issue 27, "every topic at the fast path's speed".

Records: ``--records`` JSON GMM rows (``[x_1, ..., x_8]``, one per message, drawn from a
10-component Gaussian mixture in 8-D with a fixed seed), produced with kafka-python's
producer (``compression_type``; linger 20 ms, 1 MiB batches) to one topic per compression
(``--compressions``; a codec whose library is not installed is skipped, said so) on a
:class:`~streamsvi.io.LocalBroker` (tansu, in-memory), 3 partitions, before anything is
timed. One untimed read with each reader warms up; then ``--repeats`` rounds; in each round, for each topic, both readers in turn
(which goes first alternates from round to round), each a new ``KafkaConsumer`` assigned
every partition from offset 0 (no group: no join in the timing), fetch sizes as
``KafkaSource`` sets them (16 MiB per partition, 64 MiB per fetch), ``poll(max_records=
100000)`` until every record was handed out; the time runs from the first poll to the
last record. Prints the median records/s of each reader per compression, the ratio lean /
stock and the ratio of each compression to ``none`` for the lean reader (each the median of
the ratios within a round, where both saw the same machine load), and the slow-path
fetches the lean reader counted (0 expected where the codec's library is installed).

Run: ``nice -n 10 .venv/bin/python bench/fastfetch_codecs.py`` (``--records 200000
--repeats 3``). The compression libraries are optional dependencies of kafka-python
(``pip install lz4 zstandard python-snappy``). Timings on a shared machine are noisy: read
the ratios, which come from the same round.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

PARTITIONS = 3
D, K = 8, 10


def gmm_rows(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    means = rng.normal(scale=5.0, size=(K, D))
    z = rng.integers(K, size=n)
    return means[z] + rng.normal(size=(n, D))


def available(compression: str) -> bool:
    from kafka import codec

    return {"none": lambda: True, "gzip": codec.has_gzip, "snappy": codec.has_snappy,
            "lz4": codec.has_lz4, "zstd": codec.has_zstd}[compression]()


def read_all(bootstrap: str, topic: str, n: int, lean: bool, timeout_s: float = 600.0) -> float:
    """Records/s of one consumer handing out every record of ``topic`` (values dropped)."""
    from kafka import KafkaConsumer, TopicPartition

    from streamsvi.io import _fastfetch

    c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                      max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
    try:
        if lean and not _fastfetch.install(c):
            raise RuntimeError("this kafka-python has no hook for the lean record reader")
        tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
        c.assign(tps)
        for tp in tps:
            c.seek(tp, 0)
        got, t0 = 0, time.perf_counter()
        while got < n:
            for msgs in c.poll(timeout_ms=1000, max_records=100_000).values():
                got += sum(len(m.offsets) if type(m) is _fastfetch.LeanRun else 1 for m in msgs)
            if time.perf_counter() - t0 > timeout_s:
                raise RuntimeError(f"{topic}: {got} of {n} records in {timeout_s} s")
        seconds = time.perf_counter() - t0
        if got != n:
            raise RuntimeError(f"{topic}: {got} records read, {n} produced")
        return n / seconds
    finally:
        c.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--compressions", default="none,gzip,snappy,lz4,zstd")
    args = ap.parse_args(argv)

    import kafka

    from streamsvi.io import JsonCodec, LocalBroker, _fastfetch, create_topic, produce_rows

    X = gmm_rows(args.records)
    wanted = args.compressions.split(",")
    comps = [c for c in wanted if available(c)]
    for c in wanted:
        if c not in comps:
            print(f"# {c}: skipped, its library is not installed", flush=True)
    print(f"# kafka-python {kafka.__version__}, {args.records} JSON GMM records (D={D}), "
          f"{PARTITIONS} partitions, {args.repeats} rounds", flush=True)
    rates = {(c, r): [] for c in comps for r in ("stock", "lean")}
    slow = {}
    with LocalBroker() as broker:
        topics = {}
        for c in comps:
            topics[c] = f"codecs-{c}"
            create_topic(broker.bootstrap, topics[c], partitions=PARTITIONS)
            t0 = time.perf_counter()
            conf = {"linger_ms": 20, "batch_size": 1 << 20}
            if c != "none":
                conf["compression_type"] = c
            produce_rows(broker.bootstrap, topics[c], X, JsonCodec(D), partitions=PARTITIONS,
                         timeout_s=900.0, producer_config=conf)
            print(f"# produced {c} in {time.perf_counter() - t0:.1f} s", flush=True)
        for reader in ("stock", "lean"):                     # warm-up (imports, connections)
            read_all(broker.bootstrap, topics[comps[0]], args.records, lean=reader == "lean")
        for rnd in range(args.repeats):
            order = ("stock", "lean") if rnd % 2 == 0 else ("lean", "stock")
            for c in comps:
                for reader in order:
                    before = _fastfetch.slow_path_counts()
                    r = read_all(broker.bootstrap, topics[c], args.records, lean=reader == "lean")
                    rates[(c, reader)].append(r)
                    if reader == "lean":
                        after = _fastfetch.slow_path_counts()
                        for k, v in after.items():
                            if v != before[k]:
                                slow[(c, k)] = slow.get((c, k), 0) + v - before[k]
                    print(f"# round {rnd + 1} {c:6s} {reader:5s} {r:12,.0f} rec/s", flush=True)
    med = {k: statistics.median(v) for k, v in rates.items()}
    print()
    print("| compression | kafka-python reader (rec/s) | lean reader (rec/s) | lean / stock "
          "| lean vs its none | slow-path fetches (lean) |")
    print("|---|---|---|---|---|---|")
    for c in comps:
        s, l_ = med[(c, "stock")], med[(c, "lean")]
        # ratios within a round (the same machine load), then their median
        ratio = statistics.median(a / b for a, b in zip(rates[(c, "lean")], rates[(c, "stock")]))
        rel = ("-" if "none" not in comps else f"{statistics.median(a / b for a, b in zip(rates[(c, 'lean')], rates[('none', 'lean')])):.2f}")
        fb = ", ".join(f"{k}: {v}" for (cc, k), v in slow.items() if cc == c) or "0"
        print(f"| {c} | {s:,.0f} | {l_:,.0f} | {ratio:.1f}x | {rel} | {fb} |")
    print(f"\nmedians of {args.repeats} rounds, readers alternated; "
          f"{' '.join(sys.argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
