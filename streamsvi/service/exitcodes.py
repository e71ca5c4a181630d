"""The exit codes of the ``streamsvi`` command, defined once.

The CLI returns these, ``streamsvi run --help`` lists them and the README's
"Exit codes" table documents them (a test checks that the three agree).
Standard library only: the launcher imports this before anything heavy.
"""
from __future__ import annotations

#: Finished: the source was drained, a ``--max-batches`` / ``--timeout`` stop
#: condition was met, or SIGTERM / SIGINT asked for a clean stop (the current
#: batch is finished, checkpointed and committed; also when the signal came
#: before the daemon had started).
OK = 0
#: An unexpected failure (a bug): the traceback is printed.
INTERNAL = 1
#: Bad command line, config or path, or a set-up the user can fix: a metrics port in use
#: (``metrics.port``), a missing extra (``streamsvi report`` without matplotlib), a local broker
#: that cannot start. Fix what the one-line message names. (A port in use is not a code of its
#: own: the fix is a setting, as for any other bad config.)
USAGE = 2
#: The Kafka brokers could not be reached after ``source.connect_attempts`` attempts.
BROKER_UNREACHABLE = 3
#: No valid snapshot, but the checkpoint directory or the consumer group shows an earlier run:
#: the daemon refuses a silent fresh start (``--allow-fresh-start`` overrides).
NO_CHECKPOINT = 4
#: The checkpoint storage failed mid-run (disk full, directory removed, unwritable): nothing
#: after the last durable snapshot was committed; fix the storage and restart.
STORAGE = 5
#: The consumer group assigned no partitions within ``source.assignment_timeout_seconds`` (60 s
#: unless set); the one line says what the member saw (a rebalance that never completed, more
#: members than partitions, no matching topic: the daemon said at start that it waits for it).
NOT_ASSIGNED = 6
#: A second SIGTERM / SIGINT: left at once, without checkpoint or commit (128 + SIGINT, as shells do).
SECOND_SIGNAL = 130

#: ``(code, meaning)`` for ``--help`` and the README table, in order.
TABLE = (
    (OK, "finished: drained, --max-batches/--timeout reached, or stopped cleanly by SIGTERM/SIGINT"),
    (INTERNAL, "unexpected failure (a bug; the traceback is printed)"),
    (USAGE, "bad command line, config or path, metrics port in use, missing extra (one line names it)"),
    (BROKER_UNREACHABLE, "Kafka brokers unreachable after source.connect_attempts attempts"),
    (NO_CHECKPOINT, "no valid snapshot, but an earlier run left traces (--allow-fresh-start)"),
    (STORAGE, "checkpoint storage failed mid-run (disk full, directory removed): nothing lost, restart"),
    (NOT_ASSIGNED, "no partitions assigned within source.assignment_timeout_seconds (default 60 s; "
                   "the line says why: no matching topic, a rebalance that never completed, more "
                   "members than partitions)"),
    (SECOND_SIGNAL, "second SIGTERM/SIGINT: left at once, without checkpoint or commit"),
)


def help_text() -> str:
    """The exit-code table as plain text, for an argparse epilog."""
    return "exit codes:\n" + "\n".join(f"  {code:<4} {meaning}" for code, meaning in TABLE)
