"""lagwatch: truthful PostgreSQL replica lag."""

__version__ = "0.1.0"
