"""The I/O layer: record codecs, validation, sources, dead letters, a local broker.

Layout (one job per module):

``codecs``      message bytes <-> float64 rows (:class:`JsonCodec`, :class:`BinaryBatchCodec`)
``validate``    which decoded rows may reach the model (:class:`RecordValidator`)
``sequences``   the "sequences" record kind (symbol sequences, the discrete HMM)
``bow``         bag-of-words records (kind "bow": JSON, binary CSR, raw text) for topic models
``ratings``     the "ratings" record kind (user, item, rating) for PMF: codecs, validator
``sources``     minibatches from Kafka, files, memory; positions, seek, commit, lag
``deadletter``  where rejected records go, counted by reason
``produce``     load a data set into a topic
``broker``      a throw-away local Kafka-protocol broker (tansu) for tests and demos

Nothing here imports the math packages, and they never import this one.
"""
from .broker import BrokerError, LocalBroker, create_topic, find_tansu
from .codecs import (BinaryBatchCodec, Codec, CsvCodec, DecodeError, JsonCodec,
                     codec_from_config)
from .deadletter import (DeadLetterError, DeadLetterSink, FileDeadLetterSink,
                         KafkaDeadLetterSink, MemoryDeadLetterSink)
from .produce import ProduceError, produce_rows
from .sources import (Batch, DeadLetter, FileSource, KafkaSource, KafkaUnavailableError,
                      MemorySource, Offsets, Position, Source, SourceError)
from .validate import RecordValidator
from . import sequences as _sequences  # noqa: F401,E402  registers the "sequences" record kind
from . import bow  # noqa: F401,E402  (registers the "bow" record kind)
from . import ratings as _ratings  # noqa: F401  (registers the "ratings" record kind)

__all__ = ["BrokerError", "LocalBroker", "create_topic", "find_tansu",
           "BinaryBatchCodec", "Codec", "CsvCodec", "DecodeError", "JsonCodec",
           "codec_from_config",
           "DeadLetterError", "DeadLetterSink", "FileDeadLetterSink", "KafkaDeadLetterSink",
           "MemoryDeadLetterSink",
           "ProduceError", "produce_rows",
           "Batch", "DeadLetter", "FileSource", "KafkaSource", "KafkaUnavailableError",
           "MemorySource", "Offsets", "Position", "Source", "SourceError",
           "RecordValidator"]
