"""The ``streamsvi`` command's entry point (``python -m streamsvi`` and the console script).

Installs the early SIGTERM / SIGINT handlers (:mod:`streamsvi.service.signals`)
before importing the command line, numpy or kafka-python: a signal in the
first instant of the process is recorded and honoured (a clean stop, exit 0)
instead of killing the process.
"""
import sys


def main(argv=None) -> int:
    from .service.signals import install_early
    install_early()
    from .cli import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
