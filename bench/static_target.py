"""A scrape target that serves fixed bodies: bench/scrape.py's reference for Prometheus.

Prometheus's ``scrape_duration_seconds`` ends after it has parsed and stored what it
fetched (scrape/scrape.go, ``scrapeAndReport``: the report is deferred to the end), so for
a fleet's ~83,000 series it holds Prometheus's own work on the same cores as well as the
target's answer. This process, alone in its own interpreter, answers with bodies written
by lagwatch beforehand, the format chosen from ``Accept`` as lagwatch does for Prometheus's
headers (protobuf, else OpenMetrics, else text 1.0.0, else text 0.0.4), gzipped when asked
(not for ``gzip;q=0``): Prometheus's duration for it is that same work with next to
nothing for the answer.

    python3 bench/static_target.py DIR PORT

DIR holds ``<format>`` and ``<format>.gz`` for protobuf, openmetrics, text1 and text, and
``<format>.type`` (the content type lagwatch answered).
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FORMATS = ("protobuf", "openmetrics", "text1", "text")


def main() -> None:
    folder, port = Path(sys.argv[1]), int(sys.argv[2])
    bodies = {(f, gz): (folder / (f + (".gz" if gz else ""))).read_bytes() for f in FORMATS for gz in (False, True)}
    types = {f: (folder / f"{f}.type").read_text().strip() for f in FORMATS}

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            accept = self.headers.get("Accept", "")
            fmt = ("protobuf" if "vnd.google.protobuf" in accept
                   else "openmetrics" if "openmetrics-text" in accept
                   else "text1" if "version=1.0.0" in accept else "text")
            gz = any(coding.split(";")[0].strip() == "gzip" and "q=0" not in coding.replace(" ", "").split(";")[1:]
                     for coding in self.headers.get("Accept-Encoding", "").split(","))
            body = bodies[fmt, gz]
            self.send_response(200)
            self.send_header("Content-Type", types[fmt])
            self.send_header("Content-Length", str(len(body)))
            if gz:
                self.send_header("Content-Encoding", "gzip")
            self.end_headers()
            try:
                self.wfile.write(body)
            except ConnectionError:  # the scraper gave up (its timeout): nothing to say
                pass

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
            pass

    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
