"""The deploy examples are valid for the tools that read them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"


def test_prometheus_example_loads_the_shipped_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus"
    config = DEPLOY / "prometheus" / "prometheus.yml"
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lagwatch.rules.yml" in result.stdout + result.stderr
    jobs = [job["job_name"] for job in yaml.safe_load(config.read_text())["scrape_configs"]]
    assert jobs == ["lagwatch"]


def test_the_fleet_example_scrapes_every_shard_in_one_job_with_the_fleet_rules() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: apt-get install prometheus"
    config = DEPLOY / "prometheus" / "fleet.yml"
    result = subprocess.run([promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "lagwatch.rules.yml" in output and "lagwatch.fleet.rules.yml" in output
    (job,) = yaml.safe_load(config.read_text())["scrape_configs"]
    assert job["job_name"] == "lagwatch"
    assert [group["labels"]["shard"] for group in job["static_configs"]] == ["0", "1", "2"]


def test_grafana_provisioning_examples() -> None:
    datasources = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/lagwatch.yml").read_text())
    assert datasources["apiVersion"] == 1 and datasources["datasources"][0]["type"] == "prometheus"
    dashboards = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/lagwatch.yml").read_text())
    assert dashboards["providers"][0]["type"] == "file"
    assert dashboards["providers"][0]["options"]["path"]
