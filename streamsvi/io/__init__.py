"""The I/O layer: record codecs, validation, sources, dead letters, a local broker.

Layout (one job per module; one module per record kind):

``records``     the record-kind interface (:class:`~streamsvi.io.records.RecordKind`) and registry
``codecs``      the codec interface (:class:`Codec`, :class:`DecodeError`) and helpers every kind shares
``validate``    what every kind's validator shares (the ``too_large`` size check)
``dense``       the "dense" record kind (float64 rows, the Gaussian mixtures): :class:`JsonCodec`,
                :class:`BinaryBatchCodec`, :class:`CsvCodec`, :class:`RecordValidator`
``bow``         the "bow" record kind (bag of words: JSON, binary CSR, raw text) for topic models
``sequences``   the "sequences" record kind (symbol sequences, the discrete HMM)
``ratings``     the "ratings" record kind (user, item, rating) for PMF
``labelled``    the "labelled" record kind (features + class label) for logistic regression
``sources``     minibatches from Kafka, files, memory; positions, seek, commit, lag
``deadletter``  where rejected records go, counted by reason
``produce``     load a data set into a topic
``broker``      a throw-away local Kafka-protocol broker (tansu) for tests and demos

Nothing here imports the math packages, and they never import this one.
"""
from .broker import BrokerError, LocalBroker, create_topic, find_tansu
from .codecs import Codec, DecodeError
from .dense import BinaryBatchCodec, CsvCodec, JsonCodec, RecordValidator, codec_from_config
from .deadletter import (DeadLetterError, DeadLetterSink, FileDeadLetterSink,
                         KafkaDeadLetterSink, MemoryDeadLetterSink)
from .produce import ProduceError, produce_rows
from .sources import (Batch, DeadLetter, FileSource, KafkaSource, KafkaUnavailableError,
                      MemorySource, Offsets, Position, Source, SourceError)
from . import bow, dense, labelled, ratings, sequences

#: The record kinds' modules; importing each registered its kind in records.KINDS.
_KIND_MODULES = (dense, sequences, bow, ratings, labelled)

__all__ = ["BrokerError", "LocalBroker", "create_topic", "find_tansu",
           "BinaryBatchCodec", "Codec", "CsvCodec", "DecodeError", "JsonCodec",
           "codec_from_config",
           "DeadLetterError", "DeadLetterSink", "FileDeadLetterSink", "KafkaDeadLetterSink",
           "MemoryDeadLetterSink",
           "ProduceError", "produce_rows",
           "Batch", "DeadLetter", "FileSource", "KafkaSource", "KafkaUnavailableError",
           "MemorySource", "Offsets", "Position", "Source", "SourceError",
           "RecordValidator"]
