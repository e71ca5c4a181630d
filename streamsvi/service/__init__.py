"""The daemon: config, the consumer loop, metrics, CLI glue."""
