"""What λ on the lambda topic costs (issue 25 item 3): a full λ written and read back.

    python bench/lambda_topic.py --topics 100 --words 100000     # λ of 80 MB

Starts a local tansu broker, writes one full λ of an LDA state (K × V float64)
with :class:`LambdaLogWriter` (npz bytes, sha256, chunks, one transaction) and
loads it with a fresh :class:`LambdaLog` (a late worker: tail, chunks, digest,
``np.load``), then sends the same state as a worker's λ_0 proposal (in chunks,
one transaction) and joins it as the applier does, and prints bytes and seconds. A step record's size is printed
too. Times are wall-clock on this machine, broker included.
"""
import argparse
import resource
import time
import uuid
import warnings

warnings.filterwarnings("ignore")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--topics", type=int, default=100)
    ap.add_argument("--words", type=int, default=100000)
    ap.add_argument("--chunk-bytes", type=int, default=1000000)
    ap.add_argument("--rounds", type=int, default=2)
    a = ap.parse_args()

    import numpy as np

    from streamsvi.inference.engine import SVI
    from streamsvi.io.broker import LocalBroker, create_topic
    from streamsvi.models import LDA
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    from streamsvi.service.roles.lambda_log import LambdaLog, LambdaLogWriter, state_bytes, step_record
    from streamsvi.service.roles.transport import ChunkAssembler, Delta, init_messages, init_state, is_chunk

    engine = SVI(LDA(n_components=a.topics, n_features=a.words), n_total=1e6)
    rng = np.random.default_rng(0)
    docs = np.zeros((a.topics, a.words))
    docs[np.arange(a.topics), rng.integers(0, a.words, a.topics)] = 1.0
    state = engine.init(docs, seed=1)
    lam_bytes = sum(v.nbytes for v in state.lam.values())
    t0 = time.perf_counter()
    payload = len(state_bytes(engine, state))
    ser = time.perf_counter() - t0
    step = len(step_record(uuid.uuid4().hex[:16], 123456, 9876543, 1.0, 1234567))
    print(f"λ: K={a.topics} V={a.words}: {lam_bytes / 1e6:.1f} MB of float64; full-λ payload "
          f"{payload / 1e6:.1f} MB in {-(-payload // a.chunk_bytes)} chunks; npz bytes built in {ser:.2f} s; "
          f"a step record {step} B")
    with LocalBroker() as broker:
        for r in range(a.rounds):
            lam_topic, deltas = f"lambda-{uuid.uuid4().hex[:8]}", f"deltas-{uuid.uuid4().hex[:8]}"
            create_topic(broker.bootstrap, lam_topic, partitions=1)
            create_topic(broker.bootstrap, deltas, partitions=1)
            w = LambdaLogWriter(broker.bootstrap, lam_topic, f"bench-{uuid.uuid4().hex[:6]}", a.chunk_bytes)
            t0 = time.perf_counter()
            _, n_full = w.publish([], (engine, state, 0))
            wt = time.perf_counter() - t0
            reader = LambdaLog(broker.bootstrap, lam_topic, deltas)
            t0 = time.perf_counter()
            assert reader.refresh() and reader.state.lam.array_equal(state.lam)
            rt = time.perf_counter() - t0
            print(f"round {r + 1}: full λ {n_full / 1e6:.1f} MB on the broker; write (npz, sha256, "
                  f"produce, commit) {wt:.2f} s = {n_full / 1e6 / wt:.0f} MB/s; late reader load (tail, "
                  f"fetch, sha256, np.load) {rt:.2f} s = {n_full / 1e6 / rt:.0f} MB/s")
            reader.close()
            w.close()
            # a worker's λ_0 proposal of the same state, in chunks, one transaction; the
            # applier's side: read_committed, join the chunks, decode, adopt
            prod = KafkaProducer(bootstrap_servers=broker.bootstrap, transactional_id=f"bench-{uuid.uuid4().hex[:6]}",
                                 max_request_size=a.chunk_bytes + (1 << 20))
            prod.init_transactions()
            t0 = time.perf_counter()
            msgs = init_messages("w0", engine, state, a.chunk_bytes)
            prod.begin_transaction()
            for m in msgs:
                prod.send(deltas, m, partition=0)
            prod.commit_transaction()
            pt = time.perf_counter() - t0
            prod.close()
            size = sum(len(m) for m in msgs)
            c = KafkaConsumer(bootstrap_servers=broker.bootstrap, isolation_level="read_committed",
                              enable_auto_commit=False, max_partition_fetch_bytes=64 << 20)
            tp = TopicPartition(deltas, 0)
            c.assign([tp])
            c.seek_to_beginning(tp)
            t0, asm, whole = time.perf_counter(), ChunkAssembler(), None
            while whole is None:
                for m in c.poll(timeout_ms=500).get(tp, []):
                    whole = asm.feed(m.value) if is_chunk(m.value) else m.value
            _, proposed = init_state(Delta.decode(whole))
            at = time.perf_counter() - t0
            c.close()
            assert proposed.lam.array_equal(state.lam)
            print(f"         λ_0 proposal {size / 1e6:.1f} MB in {len(msgs)} messages: worker (encode, chunk, "
                  f"produce, commit) {pt:.2f} s = {size / 1e6 / pt:.0f} MB/s; applier (read, join, sha256, "
                  f"decode) {at:.2f} s = {size / 1e6 / at:.0f} MB/s")
    print(f"peak RSS of this process (writer and reader): "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3:.0f} MB")


if __name__ == "__main__":
    main()
