"""Accept and Accept-Encoding as RFC 9110 reads them (serve/negotiation.py): tables."""

from __future__ import annotations

import pytest
from lagwatch.serve.negotiation import accepts_gzip, choose_format


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


# The Accept headers scrapers send, quoted. Prometheus 2.42 (Debian 12's): scrape/scrape.go's
# scrapeAcceptHeader, and with --enable-feature=native-histograms scrapeAcceptHeaderWithProtobuf.
# Prometheus 3.x: acceptHeader() over config.ScrapeProtocolsHeaders, weights from 0.(n+1) down,
# escaping=allow-utf-8 on the 1.0.0 text formats; its default protocols, and the order it
# uses when scrape_native_histograms (3.9+) or the native-histograms flag asks for protobuf.
PROMETHEUS_2_42 = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                   "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_2_42_NATIVE = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited,"
                          "application/openmetrics-text;version=1.0.0;q=0.8,application/openmetrics-text;version=0.0.1;"
                          "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")
PROMETHEUS_3 = ("application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,"
                "application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,"
                "text/plain;version=0.0.4;q=0.3,*/*;q=0.2")
PROMETHEUS_3_PROTO = ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=delimited;"
                      "q=0.6,application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.5,"
                      "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=1.0.0;"
                      "escaping=allow-utf-8;q=0.3,text/plain;version=0.0.4;q=0.2,*/*;q=0.1")
# scrape_protocols: [PrometheusText1.0.0], metric_name_escaping_scheme: underscores
PROMETHEUS_3_TEXT_ONLY = "text/plain;version=1.0.0;escaping=underscores;q=0.2,*/*;q=0.1"
BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,*/*;q=0.8"
TEXT_004 = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
PROTOBUF = "application/vnd.google.protobuf; proto=io.prometheus.client.MetricFamily; encoding=delimited"


@pytest.mark.parametrize("accept, content_type, body", [
    (PROMETHEUS_2_42, OPENMETRICS, "openmetrics"),
    (PROMETHEUS_2_42_NATIVE, PROTOBUF, "protobuf"),
    (PROMETHEUS_3, OPENMETRICS + "; escaping=allow-utf-8", "openmetrics"),
    (PROMETHEUS_3_PROTO, PROTOBUF, "protobuf"),
    (PROMETHEUS_3_TEXT_ONLY, "text/plain; version=1.0.0; charset=utf-8; escaping=underscores", "text"),
    ("application/openmetrics-text;version=0.0.1", "application/openmetrics-text; version=0.0.1; charset=utf-8",
     "openmetrics"),
    ("application/openmetrics-text", OPENMETRICS, "openmetrics"),
    ("text/plain;version=0.0.4", TEXT_004, "text"),
    ("text/plain", TEXT_004, "text"),
    ("*/*", TEXT_004, "text"),  # curl's
    (BROWSER, TEXT_004, "text"),
    (None, TEXT_004, "text"),  # no header
    ("", TEXT_004, "text"),
    ("garbage", TEXT_004, "text"),
    ("application/json", TEXT_004, "text"),  # nothing lagwatch writes: text, never 406
    ("text/plain;version=9.9.9", TEXT_004, "text"),
    ("application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;encoding=text", TEXT_004, "text"),
    ("application/vnd.google.protobuf", TEXT_004, "text"),  # which message, how delimited: not said
    ("application/openmetrics-text;q=0,text/plain;q=0.1", TEXT_004, "text"),  # refused, said so
    ("application/openmetrics-text;q=abc", TEXT_004, "text"),  # a malformed weight refuses
    ("text/plain;q=0.5,application/openmetrics-text;q=0.5", OPENMETRICS, "openmetrics"),  # a tie: the cheaper
    ("APPLICATION/OpenMetrics-Text; Version=1.0.0", OPENMETRICS, "openmetrics"),  # case-insensitive names
    # an unknown scheme is not said back
    ('application/openmetrics-text;version="1.0.0";escaping=bogus', OPENMETRICS, "openmetrics"),
    (",,;;=,text/plain;;version=1.0.0", "text/plain; version=1.0.0; charset=utf-8", "text"),
    # The most specific range gives a format its weight: text/* (0.1) over */* (0.9)...
    ("text/*;q=0.1,*/*;q=0.9,application/openmetrics-text;q=0.5", OPENMETRICS, "openmetrics"),
    # ...and a type with parameters over the bare type: 0.0.4 refused, OpenMetrics taken
    ("text/plain;version=0.0.4;q=0,text/plain,application/openmetrics-text;q=0.2", OPENMETRICS, "openmetrics"),
    ("application/openmetrics-text;version=1.0.0;q=0.9,application/openmetrics-text;q=0", OPENMETRICS,
     "openmetrics"),
    # dots would escape lagwatch_up to lagwatch__up: what is sent is said, underscores
    ("text/plain;version=1.0.0;escaping=dots", "text/plain; version=1.0.0; charset=utf-8; escaping=underscores",
     "text"),
    ("application/openmetrics-text;version=1.0.0;escaping=values", OPENMETRICS + "; escaping=values",
     "openmetrics"),
])
def test_each_accept_header_gets_the_format_it_prefers(accept: str | None, content_type: str, body: str) -> None:
    choice = choose_format(accept)
    assert (choice.content_type, choice.format.key) == (content_type, body)
