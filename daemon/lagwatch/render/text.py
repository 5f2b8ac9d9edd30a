"""The text expositions: Prometheus text 0.0.4 and 1.0.0, and OpenMetrics 1.0.0.

The three write the same sample lines (written again for each format asked of a
snapshot: two text formats asked of one snapshot are rare, and keeping a fleet's 57,600
lines for them would hold megabytes a snapshot); they differ in the family's head and the
end:

- **text 0.0.4** (as prometheus_client writes it, but for the order of labels and Python's
  way of writing floats): ``# HELP`` (backslash and newline escaped) and ``# TYPE`` under the
  name the samples carry (a counter's ``_total``; an info is a gauge named ``_info``).
- **text 1.0.0** is 0.0.4 with UTF-8 metric and label names allowed (quoted inside the
  braces) and the ``escaping`` a scraper asks for. Every name lagwatch writes is a legacy
  name (``[a-zA-Z_:][a-zA-Z0-9_:]*``, checked for the whole catalogue by a test), which
  the escaping schemes but "dots" leave as it is: the bytes are 0.0.4's (render/formats.py
  says which scheme was written).
- **OpenMetrics 1.0.0**: ``# TYPE``, ``# UNIT`` (where the name ends in its unit, as the spec
  requires) and ``# HELP`` (quotes escaped too) under the family's own name (a counter's
  without ``_total``, an info's without ``_info``, both of type ``counter``/``info``), and
  ``# EOF`` last. ``_created`` is left out (the spec allows it: every lagwatch counter
  starts at 0 with the process).
"""

from __future__ import annotations

from collections.abc import Iterable

from lagwatch.render.exposition import Family, unit_of

_SPECIAL = {"inf": "+Inf", "-inf": "-Inf", "nan": "NaN"}


def _value(value: float) -> str:
    """A sample value as Prometheus reads it: Python's shortest repr of the float, with
    +Inf, -Inf and NaN spelled as Prometheus does (Go writes large numbers with an
    exponent sooner than Python; both parse the same)."""
    text = repr(float(value))
    return _SPECIAL.get(text, text)


class _Escaped(dict[str, str]):
    """Label values as written (escaped), each worked out once: the same cluster, replica
    and node names recur in every family. Emptied now and then so that it stays small."""

    def __missing__(self, value: str) -> str:
        if len(self) > 100_000:
            self.clear()
        escaped = value
        if "\\" in value or '"' in value or "\n" in value:
            escaped = value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
        self[value] = escaped
        return escaped


_ESCAPED = _Escaped()


def sample_lines(family: Family) -> list[str]:
    """A family's sample lines."""
    return _WRITERS[family.kind](family)


def _gauge_lines(f: Family) -> list[str]:
    series, template, esc = f.series, f.template, _ESCAPED.__getitem__
    out: list[str] = []
    add = out.append
    for labels, value in f.samples:
        text = repr(float(value))  # _value(), inlined: this runs once per series
        if text in _SPECIAL:
            text = _SPECIAL[text]
        if labels:
            add(f"{series}{{{template.format(*map(esc, labels))}}} {text}\n")
        else:
            add(f"{series} {text}\n")
    if f.groups:
        shared = template.rsplit(",", 1)[0]
        name = f.labelnames[-1]
        for labels, pairs in f.groups:
            base = shared.format(*map(esc, labels)) if labels else ""
            head = f"{series}{{{base}," if base else f"{series}{{"
            for label, value in pairs:
                text = repr(float(value))
                if text in _SPECIAL:
                    text = _SPECIAL[text]
                add(f'{head}{name}="{_ESCAPED[label]}"}} {text}\n')
    return out


def _info_lines(f: Family) -> list[str]:
    series, template, esc = f.series, f.template, _ESCAPED.__getitem__
    return [f"{series}{{{template.format(*map(esc, labels))}}} 1.0\n" for labels, _ in f.samples]


def _histogram_lines(f: Family) -> list[str]:
    name, template, esc = f.name, f.template, _ESCAPED.__getitem__
    out: list[str] = []
    add = out.append
    for labels, buckets, sum_value, _native in f.samples:
        base = template.format(*map(esc, labels))
        head, plain = (f"{name}_bucket{{{base},", f"{{{base}}}") if base else (f"{name}_bucket{{", "")
        count: float = 0
        for le, count in buckets:
            # Bucket counts are whole numbers: "12.0", as prometheus_client writes them.
            add(f'{head}le="{le}"}} {count}.0\n' if count.__class__ is int else f'{head}le="{le}"}} {_value(count)}\n')
        add(f"{name}_count{plain} {_value(count)}\n")
        if sum_value is not None:
            add(f"{name}_sum{plain} {_value(sum_value)}\n")
    return out


def _summary_lines(f: Family) -> list[str]:
    name, template, esc = f.name, f.template, _ESCAPED.__getitem__
    out: list[str] = []
    add = out.append
    for labels, quantiles, count, sum_value in f.samples:
        base = template.format(*map(esc, labels))
        head, plain = (f"{name}{{{base},", f"{{{base}}}") if base else (f"{name}{{", "")
        for q, value in quantiles:
            add(f'{head}quantile="{q}"}} {_value(value)}\n')
        add(f"{name}_count{plain} {_value(count)}\n")
        add(f"{name}_sum{plain} {_value(sum_value)}\n")
    return out


_WRITERS = {"gauge": _gauge_lines, "counter": _gauge_lines, "info": _info_lines,
            "histogram": _histogram_lines, "summary": _summary_lines}


def _text_head(f: Family) -> str:
    help_text = f.documentation.replace("\\", r"\\").replace("\n", r"\n")
    kind = "gauge" if f.kind == "info" else f.kind
    return f"# HELP {f.series} {help_text}\n# TYPE {f.series} {kind}\n"


def _openmetrics_head(f: Family) -> str:
    help_text = f.documentation.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    unit = unit_of(f.name)
    unit_line = f"# UNIT {f.name} {unit}\n" if unit else ""
    return f"# TYPE {f.name} {f.kind}\n{unit_line}# HELP {f.name} {help_text}\n"


def render_text(families: Iterable[Family]) -> bytes:
    """The families in the Prometheus text format (0.0.4, and 1.0.0: the same bytes for
    lagwatch's names); a family with no sample is declared all the same (its HELP and TYPE
    lines)."""
    out: list[str] = []
    for f in families:
        out.append(_text_head(f))
        out.extend(sample_lines(f))
    return "".join(out).encode()


def render_openmetrics(families: Iterable[Family]) -> bytes:
    """The families in OpenMetrics 1.0.0 text, ``# EOF`` last."""
    out: list[str] = []
    for f in families:
        out.append(_openmetrics_head(f))
        out.extend(sample_lines(f))
    out.append("# EOF\n")
    return "".join(out).encode()
