"""What a scraper's request headers ask of /metrics: which format, and whether in gzip.

HTTP negotiation (RFC 9110, sections 12.5.1 and 12.5.3) is small enough to write here, and
no maintained library does it for media types with parameters (Prometheus tells its
formats apart by ``version``, ``proto`` and ``encoding``):

- ``Accept`` is a list of media ranges with parameters and an optional ``q`` weight. Each
  format lagwatch writes (render/formats.py) takes the weight of the most specific range
  that matches it (a type with parameters, over the bare type, over ``type/*``, over
  ``*/*``); the heaviest above 0 wins, and on a tie the cheapest to send (protobuf, then
  OpenMetrics, then text 1.0.0, then 0.0.4). Where lagwatch reads less than RFC 9110
  allows, it reads as client_golang does: ``*/*``, ``text/*`` and a bare ``text/plain``
  match text 0.0.4 only (what every scraper reads), a bare OpenMetrics type 1.0.0. No
  header, a header nothing matches, or one that cannot be read: text 0.0.4 (never 406: a
  scraper that reads anything reads that).
- ``Accept-Encoding`` is a list of codings with optional ``q`` weights; a coding with
  ``q=0`` is refused, ``*`` stands for every coding not named, and an absent header means
  the client takes any coding but has asked for none (identity is then the answer).
  Prometheus sends ``Accept-Encoding: gzip`` on every scrape.
"""

from __future__ import annotations

from lagwatch.render import formats
from lagwatch.render.formats import Choice

PROTOBUF_TYPE = "application/vnd.google.protobuf"
OPENMETRICS_TYPE = "application/openmetrics-text"
OPENMETRICS_VERSIONS = ("1.0.0", "0.0.1")
# On a tie of weights, the cheaper to send first.
_PREFERENCE = ("protobuf", "openmetrics", "text-1.0.0", "text-0.0.4")


def _weight(params: list[str]) -> float:
    """A coding's q value (1 when not given; 0 for a malformed one: refused, never guessed)."""
    for param in params:
        key, _, value = param.partition("=")
        if key.strip().lower() == "q":
            try:
                q = float(value.strip())
            except ValueError:
                return 0.0
            return q if 0.0 <= q <= 1.0 else 0.0
    return 1.0


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Whether a response compressed with gzip may be sent (``gzip`` or ``x-gzip`` named
    with a weight above 0, or ``*`` above 0 and gzip not named)."""
    if not accept_encoding:
        return False
    named: float | None = None
    star: float | None = None
    for item in accept_encoding.split(","):
        coding, *params = item.split(";")
        coding = coding.strip().lower()
        if coding in ("gzip", "x-gzip"):
            named = max(named or 0.0, _weight(params))
        elif coding == "*":
            star = _weight(params)
    if named is not None:
        return named > 0.0
    return star is not None and star > 0.0


def _media_range(item: str) -> tuple[str, dict[str, str], float] | None:
    """One range of an Accept header: its type, its parameters (names lowercased, quotes
    taken off), its weight; None when it is no media range at all."""
    kind, *params = item.split(";")
    kind = kind.strip().lower()
    if kind.count("/") != 1 or " " in kind:
        return None
    found: dict[str, str] = {}
    q = 1.0
    for param in params:
        key, eq, value = param.partition("=")
        key, value = key.strip().lower(), value.strip().strip('"')
        if not eq:
            continue
        if key == "q":
            q = _weight([param])
        else:
            found[key] = value
    return kind, found, q


def _offered(kind: str, params: dict[str, str]) -> tuple[str, Choice, int] | None:
    """What lagwatch writes that a range matches: the variant, the answer, and how specific
    the match is (3: the type with parameters, 2: the bare type, 1: ``text/*``, 0: ``*/*``)."""
    escaping = params.get("escaping")
    specificity = 3 if params else 2
    if kind == PROTOBUF_TYPE:
        if params.get("proto") == "io.prometheus.client.MetricFamily" and params.get("encoding") == "delimited":
            return "protobuf", formats.protobuf(escaping), 3
        return None  # the text and compact-text encodings are not written
    if kind == OPENMETRICS_TYPE:
        version = params.get("version", "1.0.0")
        if version in OPENMETRICS_VERSIONS:
            return "openmetrics", formats.openmetrics(version, escaping), specificity
        return None
    if kind == "text/plain":
        version = params.get("version", "0.0.4")
        if version == "0.0.4":
            return "text-0.0.4", formats.text(), specificity
        if version == "1.0.0":
            return "text-1.0.0", formats.text("1.0.0", escaping), specificity
        return None
    if kind == "text/*":
        return "text-0.0.4", formats.DEFAULT, 1
    if kind == "*/*":
        return "text-0.0.4", formats.DEFAULT, 0
    return None


def choose_format(accept: str | None) -> Choice:
    """The format to answer an ``Accept`` header with, and its exact content type."""
    if not accept:
        return formats.DEFAULT
    best: dict[str, tuple[int, float, Choice]] = {}  # variant -> (specificity, weight, answer)
    for item in accept.split(","):
        parsed = _media_range(item)
        if parsed is None:
            continue
        kind, params, q = parsed
        offered = _offered(kind, params)
        if offered is None:
            continue
        variant, choice, specificity = offered
        known = best.get(variant)
        if known is None or (specificity, q) > known[:2]:
            best[variant] = (specificity, q, choice)
    ranked = [(weight, -_PREFERENCE.index(variant), choice)
              for variant, (_, weight, choice) in best.items() if weight > 0.0]
    if not ranked:
        return formats.DEFAULT
    return max(ranked, key=lambda r: r[:2])[2]
