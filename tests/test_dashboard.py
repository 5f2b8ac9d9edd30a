"""The shipped Grafana dashboard: generated, importable, laid out sanely, and every query is PromQL.

Running the queries against a real Prometheus scraping a real cluster is in
tests/integration/test_observability_e2e.py; here promtool parses them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
DASHBOARDS = ROOT / "dashboards"
sys.path.insert(0, str(DASHBOARDS))
import generate  # noqa: E402  (dashboards/generate.py, not a package)

DATASOURCES = {"${DS_PROMETHEUS}", "${datasource}", "$datasource"}


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((DASHBOARDS / "lagwatch.json").read_text(encoding="utf-8"))
    return loaded


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel, rows included, also those inside collapsed rows."""
    out: list[dict[str, Any]] = []
    for panel in dashboard["panels"]:
        out.append(panel)
        out.extend(panel.get("panels", []))
    return out


def data_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in panels(dashboard) if p["type"] != "row"]


def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if Path("/usr/bin/promtool").exists() else None)
    if found is None:
        pytest.fail("promtool is not installed: it comes with Debian's `prometheus` package "
                    "(apt-get install prometheus, as .ci/run does); the dashboard's queries cannot be checked")
    return found


# -- (a) the committed JSON is what the generator builds --------------------------------------


def test_committed_json_is_generated(dashboard: dict[str, Any]) -> None:
    assert dashboard == generate.build_dashboard(), "run python3 dashboards/generate.py"
    assert (DASHBOARDS / "lagwatch.json").read_text(encoding="utf-8") == generate.render()


def test_generate_check_exit_codes(tmp_path: Path) -> None:
    script = str(DASHBOARDS / "generate.py")
    ok = subprocess.run([sys.executable, script, "--check"], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    stale = tmp_path / "lagwatch.json"
    stale.write_text(generate.render().replace('"refresh": "30s"', '"refresh": "5s"'), encoding="utf-8")
    bad = subprocess.run([sys.executable, script, "--check", "--output", str(stale)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "out of date" in bad.stderr, bad.stdout + bad.stderr
    written = subprocess.run([sys.executable, script, "--output", str(stale)], capture_output=True, text=True,
                             timeout=60)
    assert written.returncode == 0 and stale.read_text(encoding="utf-8") == generate.render()


def test_generator_is_lint_and_type_clean() -> None:
    if shutil.which("ruff") is None:
        pytest.fail("ruff is not installed (pip install -e '.[test]')")
    for cmd in ([sys.executable, "-m", "ruff", "check", "dashboards", "tests/test_dashboard.py"],
                [sys.executable, "-m", "mypy", "--strict", "dashboards/generate.py"]):
        result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout + result.stderr


# -- (b) importable through Grafana's UI, and laid out sanely ----------------------------------


def test_import_metadata(dashboard: dict[str, Any]) -> None:
    assert dashboard["__inputs"] == [{
        "name": "DS_PROMETHEUS", "label": "Prometheus", "description": "Prometheus that scrapes lagwatch",
        "type": "datasource", "pluginId": "prometheus", "pluginName": "Prometheus"}]
    requires = {(r["type"], r["id"]) for r in dashboard["__requires"]}
    assert {("grafana", "grafana"), ("datasource", "prometheus")} <= requires
    assert {("panel", p["type"]) for p in data_panels(dashboard)} <= requires
    assert dashboard["uid"] == "lagwatch"
    assert dashboard["title"] == "lagwatch — replica lag"
    assert 36 <= dashboard["schemaVersion"] <= 41
    assert dashboard["id"] is None


def test_variables(dashboard: dict[str, Any]) -> None:
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(variables) == ["datasource", "cluster", "replica"]
    ds = variables["datasource"]
    assert ds["type"] == "datasource" and ds["query"] == "prometheus"
    assert ds["current"]["value"] == "${DS_PROMETHEUS}"  # the import input picks the default
    assert variables["cluster"]["query"] == "label_values(lagwatch_up, cluster)"
    assert variables["replica"]["query"] == 'label_values(lagwatch_replica_lag_seconds{cluster=~"$cluster"}, replica)'
    for name in ("cluster", "replica"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"], name
        assert var["datasource"]["uid"] in DATASOURCES and var["definition"] == var["query"], name


def test_annotations(dashboard: dict[str, Any]) -> None:
    prom = [a for a in dashboard["annotations"]["list"] if not a.get("builtIn")]
    assert [a["name"] for a in prom] == ["Pool: eject", "Pool: readmit"]
    assert len({a["iconColor"] for a in prom}) == 2
    for annotation, action in zip(prom, ("eject", "readmit"), strict=True):
        assert annotation["datasource"]["uid"] in DATASOURCES and annotation["enable"]
        assert "changes(lagwatch_pool_changes_total{" in annotation["expr"]
        assert f'action="{action}"' in annotation["expr"] and "[$__interval]" in annotation["expr"]


def test_panels_have_datasource_targets_and_descriptions(dashboard: dict[str, Any]) -> None:
    for panel in data_panels(dashboard):
        title = panel["title"]
        assert panel["datasource"]["uid"] in DATASOURCES and panel["datasource"]["type"] == "prometheus", title
        assert len(panel.get("description", "")) > 40, f"{title}: say what it shows and why"
        assert panel["targets"], title
        ref_ids = [t.get("refId") for t in panel["targets"]]
        assert all(ref_ids) and len(set(ref_ids)) == len(ref_ids), title
        for target in panel["targets"]:
            assert target.get("expr", "").strip(), (title, target)
            assert target.get("datasource", {}).get("uid") in DATASOURCES, (title, target)
        if panel["type"] == "timeseries":
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"


def test_ids_unique(dashboard: dict[str, Any]) -> None:
    ids = [p["id"] for p in panels(dashboard)]
    assert all(isinstance(i, int) for i in ids)
    assert len(set(ids)) == len(ids), Counter(ids).most_common(3)


def test_grid_within_24_columns_and_no_overlap(dashboard: dict[str, Any]) -> None:
    boxes = []
    for panel in dashboard["panels"]:  # top level: what is on screen with every row expanded
        g = panel["gridPos"]
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0, panel["title"]
        assert g["x"] + g["w"] <= 24, f"{panel['title']}: {g} is wider than 24 columns"
        boxes.append((panel["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for i, (a, ax0, ay0, ax1, ay1) in enumerate(boxes):
        for b, bx0, by0, bx1, by1 in boxes[i + 1:]:
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a!r} overlaps {b!r}"


def test_most_urgent_first(dashboard: dict[str, Any]) -> None:
    top = dashboard["panels"]
    assert top[0]["type"] == "row" and top[0]["title"] == "Lag"
    rows = [p["title"] for p in top if p["type"] == "row"]
    assert rows == ["Lag", "Why replicas lag", "Fleet", "Synchronous replication", "Slots & WAL", "WAL archiving",
                    "Logical replication", "lagwatch itself"]
    assert top[1]["type"] == "stat" and "lagwatch_replica_lag_seconds" in top[1]["targets"][0]["expr"]


def test_staleness_panel_draws_p95_and_sla_line(dashboard: dict[str, Any]) -> None:
    [panel] = [p for p in data_panels(dashboard) if p["title"] == "Staleness (headline lag)"]
    exprs = {t["refId"]: t["expr"] for t in panel["targets"]}
    assert "lagwatch_replica_lag_seconds{" in exprs["A"]
    assert 'quantile="0.95"' in exprs["B"] and "lagwatch_replica_lag_window_seconds" in exprs["B"]
    assert "lagwatch_replica_sla_max_lag_seconds" in exprs["C"]
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"
    [sla] = [o for o in panel["fieldConfig"]["overrides"] if o["matcher"] == {"id": "byFrameRefID", "options": "C"}]
    props = {p["id"]: p["value"] for p in sla["properties"]}
    assert props["custom.lineStyle"]["fill"] == "dash"


def test_timestamp_signal_only_in_its_labelled_panel(dashboard: dict[str, Any]) -> None:
    """The replay-timestamp age is on the dashboard in exactly one panel, whose title warns
    that it misleads on an idle primary (and nowhere else, where it could pass for lag)."""
    using = [p["title"] for p in data_panels(dashboard)
             if any("last_replay_timestamp_age" in t["expr"] for t in p["targets"])]
    assert len(using) == 1, using
    assert "misleading on idle primary" in using[0], using


# -- (c) the queries: listed completely, substituted like Grafana, valid PromQL -----------------


def test_panel_queries_cover_the_json(dashboard: dict[str, Any]) -> None:
    listed = generate.panel_queries()
    in_json = [(p["title"], t["expr"]) for p in data_panels(dashboard) for t in p["targets"]]
    in_json += [(f"annotation: {a['name']}", a["expr"]) for a in dashboard["annotations"]["list"] if "expr" in a]
    assert Counter((t, e) for t, e, _ in listed if not t.startswith("variable: ")) == Counter(in_json)
    variables = {v["name"]: v["query"] for v in dashboard["templating"]["list"]}
    for title, expr, must in listed:
        if title.startswith("variable: "):
            assert must and variables[title.removeprefix("variable: ")].startswith(f"label_values({expr}, ")
    assert all(isinstance(must, bool) for _, _, must in listed)
    assert sum(must for _, _, must in listed) >= 20  # the e2e test must have something to check


def test_substitute_like_grafana() -> None:
    expr = 'rate(x{cluster=~"$cluster", replica=~"${replica}"}[$__rate_interval]) offset $__interval'
    assert generate.substitute(expr) == 'rate(x{cluster=~"main", replica=~".*"}[75s]) offset 1m'
    assert generate.substitute(expr, cluster=["a.b", "c"], replica=["r1"], interval="5s") == (
        'rate(x{cluster=~"(a\\\\.b|c)", replica=~"r1"}[1m]) offset 5s')
    # $__rate_interval = max($__interval + scrape interval, 4 * scrape interval)
    assert generate.substitute("$__rate_interval", interval="1m") == "75s"
    assert generate.substitute("$__rate_interval", interval="2s", scrape_interval="1s") == "4s"
    assert generate.substitute("$__range $__range_s $__interval_ms", interval="30s", range_="6h") == "6h 21600 30000"
    with pytest.raises(ValueError, match="unknown variable"):
        generate.substitute("x[$nope]")
    for title, expr, _ in generate.panel_queries():
        for kwargs in ({}, {"cluster": ["main", "other"], "replica": ["replica1"], "interval": "5s"}):
            assert "$" not in generate.substitute(expr, **kwargs), (title, expr)


def _promtool_check(exprs: list[tuple[str, str]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # JSON is YAML: one group per query, so promtool's message names the panel.
    groups = [{"name": f"{i:02d} {title}", "rules": [{"record": f"lagwatch_dashboard_query_{i}", "expr": expr}]}
              for i, (title, expr) in enumerate(exprs)]
    rules = tmp_path / "dashboard.rules.yml"
    rules.write_text(json.dumps({"groups": groups}, indent=1), encoding="utf-8")
    return subprocess.run([promtool(), "check", "rules", str(rules)], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("cluster,replica", [("main", ".*"), (["main", "eu-1"], ["replica1", "replica.2"])],
                         ids=["all", "multi"])
def test_queries_are_promql(tmp_path: Path, cluster: str | list[str], replica: str | list[str]) -> None:
    exprs = [(title, generate.substitute(expr, cluster=cluster, replica=replica, interval="5s"))
             for title, expr, _ in generate.panel_queries()]
    result = _promtool_check(exprs, tmp_path)
    assert result.returncode == 0, "promtool rejects dashboard queries:\n" + result.stdout + result.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in result.stdout, result.stdout


def test_promtool_check_catches_a_bad_query(tmp_path: Path) -> None:
    result = _promtool_check([("broken", 'rate(lagwatch_up{cluster=~"main"})')], tmp_path)
    assert result.returncode != 0 and "broken" in result.stdout + result.stderr, result.stdout + result.stderr


def test_the_cause_timeline_knows_every_cause() -> None:
    """The state timeline's causes are the daemon's (generate.py imports nothing of lagwatch)."""
    from lagwatch.estimate.diagnosis import CAUSES

    assert generate.CAUSES == CAUSES
