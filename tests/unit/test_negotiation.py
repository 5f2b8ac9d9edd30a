"""Accept-Encoding as RFC 9110 reads it (serve/negotiation.py): a table."""

from __future__ import annotations

import pytest
from lagwatch.serve.negotiation import accepts_gzip


@pytest.mark.parametrize("header, gzip", [
    ("gzip", True),  # what Prometheus sends
    ("GZIP", True),
    ("gzip, deflate, br", True),
    ("deflate, gzip;q=0.5", True),
    ("x-gzip", True),
    ("gzip;q=0", False),  # refused, said so
    ("gzip; q=0.000", False),
    ("*", True),
    ("*;q=0", False),
    ("*, gzip;q=0", False),  # named wins over the wildcard
    ("gzip;q=0, *", False),
    ("identity", False),
    ("br, deflate", False),
    ("", False),  # no header: any coding is acceptable, none asked for: identity
    (None, False),
    ("gzip;q=abc", False),  # a malformed weight refuses rather than guesses
    ("gzip;q=2", False),
    ("gzip;level=1", True),  # other parameters ignored
    (",,gzip,,", True),
])
def test_accepts_gzip(header: str | None, gzip: bool) -> None:
    assert accepts_gzip(header) is gzip
