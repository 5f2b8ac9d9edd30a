"""The shipped alerting: rules, their promtool unit tests, runbooks and the Alertmanager example.

Needs Debian's promtool and amtool (apt-get install prometheus prometheus-alertmanager); a
missing tool fails the test rather than skipping it, so CI cannot pass without running them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
ALERTS = ROOT / "alerts"
RULES = ALERTS / "lagwatch.rules.yml"
RULE_TESTS = ALERTS / "lagwatch.rules.test.yml"
AM_EXAMPLE = ALERTS / "alertmanager.example.yml"
RUNBOOKS = ALERTS / "runbooks"
RUNBOOK_BASE = "https://github.com/lagwatch/lagwatch/blob/main/alerts/runbooks/"
INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager"


def tool(name: str) -> str:
    path = shutil.which(name) or (f"/usr/bin/{name}" if Path(f"/usr/bin/{name}").exists() else None)
    if path is None:
        pytest.fail(f"{name} is not installed: {INSTALL_HINT}")
    return path


def run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)


def alert_rules() -> list[dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"] if "alert" in rule]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in alert_rules()]


# ---------------------------------------------------------------- the tools themselves


def test_promtool_check_rules() -> None:
    result = run(tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", str(RULES))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "SUCCESS" in output and "warning" not in output.lower(), output


def test_promtool_unit_tests() -> None:
    result = run(tool("promtool"), "test", "rules", str(RULE_TESTS))
    assert result.returncode == 0, result.stdout + result.stderr


FLEET_RULES = ALERTS / "lagwatch.fleet.rules.yml"


def test_fleet_recording_rules_check_and_pass_their_promtool_tests() -> None:
    checked = run(tool("promtool"), "check", "rules", "--lint=all", "--lint-fatal", str(FLEET_RULES))
    assert checked.returncode == 0 and "SUCCESS" in checked.stdout + checked.stderr, checked.stdout + checked.stderr
    tested = run(tool("promtool"), "test", "rules", str(ALERTS / "lagwatch.fleet.rules.test.yml"))
    assert tested.returncode == 0, tested.stdout + tested.stderr
    groups = yaml.safe_load(FLEET_RULES.read_text())["groups"]
    assert all("record" in rule and "alert" not in rule for group in groups for rule in group["rules"])


def test_amtool_check_config() -> None:
    result = run(tool("amtool"), "check-config", str(AM_EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr


# ---------------------------------------------------------------- rules: metadata and shape


def test_one_group_and_the_alerts_we_promise() -> None:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    assert len(groups) == 1 and "interval" not in groups[0]
    expected = {
        "LagwatchReplicaLagP95OverSLA": "warning", "LagwatchReplicaLagFarOverSLA": "page",
        "LagwatchReplicaNotStreaming": "warning", "LagwatchReplicaReplayPaused": "warning",
        "LagwatchReplicaEjected": "warning", "LagwatchTooFewHealthyReplicas": "page",
        "LagwatchPrimaryInReadPool": "warning", "LagwatchSlotInactive": "warning",
        "LagwatchSlotRetainedWalHigh": "warning", "LagwatchSlotWalUnreservedOrLost": "page",
        "LagwatchSlotWalKeepSizeSoon": "warning", "LagwatchDown": "page", "LagwatchNotPolling": "page",
        "LagwatchNodeDown": "warning", "LagwatchPoolerApplyErrors": "warning",
        "LagwatchConfigReloadFailed": "warning", "LagwatchClusterFileInvalid": "warning",
        "LagwatchPoolControlNotApplied": "page",
        "LagwatchSplitBrain": "page", "LagwatchNoPrimary": "page", "LagwatchReplicaNotFollowingPrimary": "warning",
        "LagwatchRoleChanged": "info", "LagwatchDiscoveryDown": "warning",
        "LagwatchSyncCommitsStalled": "page", "LagwatchSyncOneLossFromStall": "warning",
        "LagwatchSyncCommitWaitHigh": "warning", "LagwatchSlotWalLossImminent": "page",
        "LagwatchReplicaNotCatchingUp": "warning", "LagwatchOverloaded": "page",
        "LagwatchReplicaRecoveryConflicts": "warning", "LagwatchReplicaReplayAtLimit": "warning",
        "LagwatchReplicaReplayBlockedByQuery": "warning", "LagwatchReplicationHoldsHorizon": "warning",
        "LagwatchLogicalConsumerStale": "warning", "LagwatchSubscriptionApplyErrors": "warning",
        "LagwatchSubscriptionWorkerDown": "warning", "LagwatchFailoverSlotNotSynced": "warning",
        "LagwatchSlotIdleTimeoutSoon": "warning", "LagwatchArchiveFailing": "page", "LagwatchArchiveBehind": "warning",
    }
    got = {rule["alert"]: rule["labels"]["severity"] for rule in alert_rules()}
    assert got == expected
    assert len(alert_names()) == len(set(alert_names())), "duplicate alert names"


@pytest.mark.parametrize("name", alert_names())
def test_alert_metadata_and_runbook(name: str) -> None:
    rule = next(r for r in alert_rules() if r["alert"] == name)
    assert rule["labels"].get("severity") in ("page", "warning", "info"), rule
    annotations = rule.get("annotations", {})
    for key in ("summary", "description", "runbook_url"):
        assert annotations.get(key), f"{name}: no {key}"
    # Summary and description name the cluster (or the lagwatch instance for the cluster-less
    # self-monitoring alerts) and the subject.
    text = annotations["summary"] + annotations["description"]
    assert "$labels.cluster" in text or "$labels.instance" in text, name
    for subject in ("replica", "slot", "node"):
        if re.search(rf"\bby \([^)]*\b{subject}\b", rule["expr"]):
            assert f"$labels.{subject}" in text, f"{name}: does not name the {subject}"
    # The single runbook base, pointing at this alert's file, which exists.
    url = annotations["runbook_url"]
    assert url == f"{RUNBOOK_BASE}{name}.md", url
    runbook = RUNBOOKS / url.removeprefix(RUNBOOK_BASE)
    assert runbook.is_file(), f"{url}: {runbook} does not exist"
    content = runbook.read_text()
    assert content.startswith(f"# {name}\n"), runbook
    for section in ("## What it means", "## First three things to check", "## How to fix"):
        assert section in content, f"{runbook}: no '{section}'"
    # No page without a `for:` of at least 2 minutes (no pager for a 20-second blip), no
    # alert at all without one. The exceptions: two writers lose data with every commit, and
    # stalled commits hang every writing transaction (an outage already, not a blip).
    assert "for" in rule, name
    if rule["labels"]["severity"] == "page" and name not in ("LagwatchSplitBrain", "LagwatchSyncCommitsStalled"):
        assert parse_duration(rule["for"]) >= 120, f"{name}: pages after {rule['for']}"


def test_no_orphan_runbooks() -> None:
    assert sorted(p.stem for p in RUNBOOKS.glob("*.md")) == sorted(alert_names())


def test_no_rule_uses_timestamp_based_lag() -> None:
    """Timestamp lag grows on an idle primary; walsender lags freeze. Staleness is the lag."""
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            for banned in ("last_replay_timestamp", "walsender_lag_seconds", "pg_last_xact_replay"):
                assert banned not in rule["expr"], (rule.get("alert") or rule.get("record"), banned)


def test_every_alert_is_unit_tested_firing_and_silent() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    fires: dict[str, int] = {}
    silent: dict[str, int] = {}
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            counter = fires if check.get("exp_alerts") else silent
            counter[check["alertname"]] = counter.get(check["alertname"], 0) + 1
    text = RULE_TESTS.read_text()
    for name in alert_names():
        assert len(re.findall(rf"\b{name}\b", text)) >= 2, name
        assert fires.get(name, 0) >= 1, f"{name}: no case where it fires"
        assert silent.get(name, 0) >= 2, f"{name}: needs cases where it does not fire and resolves"
    # The idle-primary case checks every alert.
    idle = next(c for c in tests["tests"] if "idle primary" in c.get("name", ""))
    assert {c["alertname"] for c in idle["alert_rule_test"]} == set(alert_names())
    assert all(not c["exp_alerts"] for c in idle["alert_rule_test"])


def parse_duration(text: str) -> float:
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
    parts = re.findall(r"(\d+)(ms|s|m|h|d)", text)
    assert parts and "".join(n + u for n, u in parts) == text, text
    return sum(int(n) * units[u] for n, u in parts)


# ---------------------------------------------------------------- Alertmanager example


def am_config() -> dict[str, Any]:
    config: dict[str, Any] = yaml.safe_load(AM_EXAMPLE.read_text())
    return config


def test_alertmanager_receivers_send_resolved() -> None:
    receivers = {r["name"]: r for r in am_config()["receivers"]}
    assert set(receivers) == {"pager", "chat"}
    for receiver in receivers.values():
        hooks = receiver["webhook_configs"]
        assert hooks and all(hook.get("send_resolved") is True for hook in hooks), receiver


@pytest.mark.parametrize("labels,receiver", [
    (["severity=page", "alertname=LagwatchReplicaLagFarOverSLA", "cluster=main", "replica=r1"], "pager"),
    (["severity=page", "alertname=LagwatchDown"], "pager"),
    (["severity=page", "alertname=LagwatchOverloaded", "instance=lw:9847", "job=lagwatch"], "pager"),
    (["severity=warning", "alertname=LagwatchReplicaEjected", "cluster=main", "replica=r1"], "chat"),
    (["severity=info", "alertname=LagwatchRoleChanged", "cluster=main"], "chat"),
    (["severity=page", "alertname=LagwatchSplitBrain", "cluster=main"], "pager"),
    (["alertname=SomethingElse"], "chat"),
])
def test_alertmanager_routing(labels: list[str], receiver: str) -> None:
    result = run(tool("amtool"), "config", "routes", "test", f"--config.file={AM_EXAMPLE}", *labels)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split() == [receiver], result.stdout


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def http_json(url: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as response:
        raw = response.read()
        return json.loads(raw) if raw else None


Key = tuple[str, str, str]


def alert_key(labels: dict[str, str]) -> Key:
    return (labels["alertname"], labels.get("cluster", ""), labels.get("instance", ""))


def inhibitions(url: str, wanted: dict[Key, bool]) -> dict[Key, bool]:
    """(alertname, cluster, instance) -> inhibited, once it equals ``wanted`` or after 10 seconds."""
    deadline = time.monotonic() + 10
    while True:
        got = {alert_key(a["labels"]): bool(a["status"]["inhibitedBy"])
               for a in http_json(f"{url}/api/v2/alerts")}
        if got == wanted or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


def test_alertmanager_inhibitions() -> None:
    """Replica/slot alerts are muted while lagwatch is down or not polling for their cluster, or
    while its primary is unreachable; a replica's "not catching up" while its replay is paused;
    an instance's LagwatchOverloaded while that instance is not polling;
    nothing else, and no other cluster, is. A LagwatchDown /
    LagwatchNotPolling without a cluster label mutes every cluster only when it has no
    `instance` either (the absent() branch: no lagwatch scraped at all)."""
    binary = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if binary is None:
        pytest.fail(f"prometheus-alertmanager is not installed: {INSTALL_HINT}")
    sources = [
        {"alertname": "LagwatchNodeDown", "severity": "warning", "cluster": "a", "node": "primary"},
        {"alertname": "LagwatchNotPolling", "severity": "page", "cluster": "b", "instance": "lw:9847",
         "job": "lagwatch"},
        {"alertname": "LagwatchNodeDown", "severity": "warning", "cluster": "c", "node": "replica1"},
        # A target down that never reported a cluster (or lost it after a day down), and a
        # process stuck before exporting lagwatch_up: they page, but mute nothing (cluster d).
        {"alertname": "LagwatchDown", "severity": "page", "instance": "lw2:9847", "job": "lagwatch"},
        {"alertname": "LagwatchNotPolling", "severity": "page", "instance": "lw3:9847", "job": "lagwatch"},
        # HA: lw-h1 is down but its peer still watches cluster h, so the rule drops the
        # cluster label: h's alerts are not muted.
        {"alertname": "LagwatchDown", "severity": "page", "instance": "lw-h1:9847", "job": "lagwatch"},
        # The only lagwatch watching cluster e is down: the alert carries cluster="e".
        {"alertname": "LagwatchDown", "severity": "page", "cluster": "e", "instance": "lw-e:9847",
         "job": "lagwatch"},
        # replica1 of cluster p is paused: it is not catching up, and that needs no second alert.
        {"alertname": "LagwatchReplicaReplayPaused", "severity": "warning", "cluster": "p", "replica": "replica1"},
    ]
    targets = {
        ("LagwatchReplicaLagFarOverSLA", "a"): True, ("LagwatchSlotInactive", "a"): True,
        ("LagwatchTooFewHealthyReplicas", "a"): True,
        ("LagwatchReplicaLagFarOverSLA", "b"): True, ("LagwatchSlotWalUnreservedOrLost", "b"): True,
        ("LagwatchReplicaLagFarOverSLA", "c"): False, ("LagwatchSlotInactive", "c"): False,
        ("LagwatchReplicaNotStreaming", "d"): False, ("LagwatchSlotInactive", "d"): False,
        ("LagwatchReplicaLagFarOverSLA", "h"): False, ("LagwatchSlotInactive", "h"): False,
        ("LagwatchTooFewHealthyReplicas", "h"): False,
        ("LagwatchReplicaLagFarOverSLA", "e"): True, ("LagwatchSlotInactive", "e"): True,
        ("LagwatchTooFewHealthyReplicas", "e"): True,
        ("LagwatchReplicaNotCatchingUp", "p"): True, ("LagwatchReplicaNotCatchingUp", "c"): False,
    }
    alerts = [{"labels": labels} for labels in sources]
    for (name, cluster) in targets:
        subject = {"slot": "s1"} if name.startswith("LagwatchSlot") else (
            {} if name == "LagwatchTooFewHealthyReplicas" else {"replica": "replica1"})
        alerts.append({"labels": {"alertname": name, "severity": "page", "cluster": cluster, **subject}})
    target_state = {(name, cluster, ""): muted for (name, cluster), muted in targets.items()}
    # Per process, without a cluster: muted only by the same instance's LagwatchNotPolling
    # (with or without a cluster), by no LagwatchDown (a target that is down has no series).
    overloaded = {"lw:9847": True, "lw3:9847": True, "lw-e:9847": False, "lw9:9847": False}
    alerts += [{"labels": {"alertname": "LagwatchOverloaded", "severity": "page", "instance": instance,
                           "job": "lagwatch"}} for instance in overloaded]
    overloaded_state = {("LagwatchOverloaded", "", instance): muted for instance, muted in overloaded.items()}

    with tempfile.TemporaryDirectory(prefix="lagwatch-am-") as folder:
        port = free_port()
        log = Path(folder) / "alertmanager.log"
        with log.open("w") as out:
            proc = subprocess.Popen(
                [binary, f"--config.file={AM_EXAMPLE}", f"--storage.path={folder}/data",
                 f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
                stdout=out, stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 20
            while True:
                try:
                    urllib.request.urlopen(f"{url}/-/ready", timeout=2).close()
                    break
                except (urllib.error.URLError, ConnectionError):
                    assert time.monotonic() < deadline and proc.poll() is None, log.read_text()[-2000:]
                    time.sleep(0.2)
            http_json(f"{url}/api/v2/alerts", alerts)
            wanted = {**target_state, **overloaded_state, **{alert_key(s): False for s in sources}}
            assert inhibitions(url, wanted) == wanted
            # No lagwatch scraped at all (absent(): neither cluster nor instance label) mutes
            # every replica and slot alert, whatever the cluster.
            http_json(f"{url}/api/v2/alerts", [{"labels": {"alertname": "LagwatchDown", "severity": "page"}}])
            wanted = {**wanted, ("LagwatchDown", "", ""): False, ("LagwatchReplicaReplayPaused", "p", ""): True,
                      **{key: True for key in target_state if key[0] != "LagwatchTooFewHealthyReplicas"}}
            assert inhibitions(url, wanted) == wanted
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
