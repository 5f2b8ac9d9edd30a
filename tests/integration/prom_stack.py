"""Real Prometheus (Debian's) and Alertmanager, and a webhook receiver, for the tests.

All bind 127.0.0.1 on free ports, keep their data in a temp folder and are stopped by PID.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import failure_logs
import yaml
from lagwatch.demo.ports import free_port

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"
ALERTMANAGER = "/usr/bin/prometheus-alertmanager"
AM_EXAMPLE = ROOT / "alerts" / "alertmanager.example.yml"


def _get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


class _Process:
    def __init__(self, name: str) -> None:
        self.name = name
        self.folder = Path(tempfile.mkdtemp(prefix=f"lagwatch-{name}-"))
        self.port = free_port(["127.0.0.1"])
        self.log_path = self.folder / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self, argv: list[str], ready_path: str, timeout: float = 30) -> None:
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        failure_logs.watch(self, f"{self.name} {self.log_path}", self.log_tail)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + ready_path, timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} not ready: {self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        failure_logs.unwatch(self)
        shutil.rmtree(self.folder, ignore_errors=True)


def rules_with_shorter_for(rules: Path, folder: Path, factor: int = 4, floor: float = 5.0) -> Path:
    """A copy of a rules file whose every ``for:`` is ``factor`` times shorter (at least
    ``floor`` seconds; 0 stays 0), in ``folder``. The end-to-end tests show the shipped
    expressions, labels and annotations going through a real Prometheus and Alertmanager
    without waiting out production-length ``for:``s; promtool's tests
    (alerts/lagwatch.rules.test.yml) hold each rule to its shipped ``for:``."""
    from lagwatch.durations import parse_duration

    data = yaml.safe_load(rules.read_text())
    for group in data["groups"]:
        for rule in group["rules"]:
            if rule.get("for"):
                seconds = parse_duration(str(rule["for"]))
                # Prometheus takes whole units only ("7.5s" is refused): milliseconds.
                rule["for"] = f"{round(max(floor, seconds / factor) * 1000)}ms" if seconds else "0s"
    out = folder / f"{rules.stem}.for-div{factor}{rules.suffix}"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


class Prometheus(_Process):
    """Scrapes the given targets every second (or ``scrape_interval``) and evaluates
    ``rule_files`` every second."""

    def __init__(self, targets: list[str], rule_files: list[Path], alertmanager: str | None = None,
                 features: tuple[str, ...] = (), scrape_interval: float = 1.0) -> None:
        super().__init__("prometheus")
        self.features = features  # --enable-feature=...: native-histograms asks targets for protobuf
        config: dict[str, Any] = {
            "global": {"scrape_interval": f"{round(scrape_interval * 1000)}ms", "evaluation_interval": "1s",
                       "scrape_timeout": f"{round(min(0.9 * scrape_interval, 10) * 1000)}ms"},
            "rule_files": [str(p) for p in rule_files],
            "scrape_configs": [{"job_name": "lagwatch", "static_configs": [{"targets": targets}]}],
        }
        if alertmanager:
            config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
        self.config_file = self.folder / "prometheus.yml"
        self.config_file.write_text(yaml.safe_dump(config))

    def start(self) -> None:
        self._start([PROMETHEUS, f"--config.file={self.config_file}", f"--storage.tsdb.path={self.folder}/data",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle",
                     *(f"--enable-feature={f}" for f in self.features)], "/-/ready")

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The raw API answer for an instant query (status, data or error), now or ``at``."""
        params = {"query": expr} if at is None else {"query": expr, "time": f"{at:.3f}"}
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        try:
            result: dict[str, Any] = _get_json(url)
        except urllib.error.HTTPError as exc:
            result = json.loads(exc.read())
        return result

    def alerts(self) -> list[dict[str, Any]]:
        alerts: list[dict[str, Any]] = _get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"]
        return alerts


class Alertmanager(_Process):
    def __init__(self, config_text: str) -> None:
        super().__init__("alertmanager")
        self.config_file = self.folder / "alertmanager.yml"
        self.config_file.write_text(config_text)

    def start(self) -> None:
        self._start([ALERTMANAGER, f"--config.file={self.config_file}", f"--storage.path={self.folder}/data",
                     f"--web.listen-address=127.0.0.1:{self.port}", "--cluster.listen-address="], "/-/ready")

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


class WebhookReceiver:
    """Collects Alertmanager webhook notifications, by path (/page, /chat)."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.add(self.path, json.loads(body))
                self.send_response(200)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def add(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.received.append((path, body))

    def notifications(self, path: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [body for p, body in self.received if path is None or p == path]

    def __enter__(self) -> WebhookReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def alertmanager_config(webhook: WebhookReceiver) -> str:
    """The shipped example, with its receivers pointed at this test's webhook and its
    grouping waits shorter (as the rules' for:s are here): the routes, receivers and
    inhibitions are the example's."""
    config: dict[str, Any] = yaml.safe_load(AM_EXAMPLE.read_text())
    config["route"].update(group_wait="2s", group_interval="5s")
    for receiver in config["receivers"]:
        for hook in receiver.get("webhook_configs", []):
            hook["url"] = webhook.url(f"/{receiver['name']}")
    return yaml.safe_dump(config)
