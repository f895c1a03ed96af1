"""versiq: versioned state stores with Kafka Streams semantics, over Delta Lake and DuckDB."""

__version__ = "0.1.0"
