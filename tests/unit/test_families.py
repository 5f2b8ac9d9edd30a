"""Every family lagwatch can export is declared on every scrape and documented: the catalogue
(lagwatch.render.families), the exposition of a bare snapshot, and docs/metrics.md agree."""

from __future__ import annotations

import re
from pathlib import Path

from lagwatch.config import parse_config
from lagwatch.estimate.snapshot import NodeObservation, Snapshot
from lagwatch.estimate.tracker import ClusterTracker
from lagwatch.render import families
from lagwatch.render.text import render_text
from lagwatch.serve.export import families as exported
from lagwatch.views.server import ServerPosition

ROOT = Path(__file__).resolve().parents[2]
TYPE = re.compile(r"^# TYPE (\S+) (\S+)$", re.M)
BARE = parse_config({"interval": "1s", "clusters": [{
    "name": "main", "primary": {"dsn": "host=p"}, "replicas": [{"name": "replica1", "dsn": "host=r1"}]}]})


def bare_snapshot() -> Snapshot:
    """One cluster, a primary and a replica answering: no pool, no sync, no slots, no
    discovery, no clusters_dir, no pg_walinspect."""
    tracker = ClusterTracker(BARE.clusters[0], 1.0, 60.0)
    cluster = tracker.update([
        NodeObservation(cluster="main", node="primary", role="primary", observed_at=1.0, duration=0.001,
                        position=ServerPosition(False, 100, None, None, None, None)),
        NodeObservation(cluster="main", node="replica1", role="replica", observed_at=1.0, duration=0.001,
                        position=ServerPosition(True, None, 100, 100, "not paused", 1.0))], 1.0)
    return Snapshot(1.0, 0.01, 1, 0, (cluster,), interval=1.0, effective_interval=1.0)


def test_every_family_is_declared_on_a_bare_scrape_with_its_type() -> None:
    text = render_text(exported(bare_snapshot())).decode()
    declared = dict(TYPE.findall(text))
    assert declared == {spec.series: spec.kind if spec.kind != "info" else "gauge"
                        for spec in families.CATALOGUE.values()}
    # Declared, not sampled: a family with no series today has its HELP and TYPE and no sample.
    assert "# TYPE lagwatch_pool_held gauge" in text and "\nlagwatch_pool_held{" not in text


def test_the_window_quantiles_are_a_summary() -> None:
    """Gauges may not carry a quantile label (promtool check metrics): the window's
    quantiles are a summary's, with _count and _sum over every sample since start."""
    text = render_text(exported(bare_snapshot())).decode()
    lines = [line for line in text.splitlines() if line.startswith("lagwatch_replica_lag_window_seconds")]
    assert [line.split(" ")[0] for line in lines] == [
        'lagwatch_replica_lag_window_seconds{cluster="main",replica="replica1",quantile="0.5"}',
        'lagwatch_replica_lag_window_seconds{cluster="main",replica="replica1",quantile="0.95"}',
        'lagwatch_replica_lag_window_seconds{cluster="main",replica="replica1",quantile="0.99"}',
        'lagwatch_replica_lag_window_seconds{cluster="main",replica="replica1",quantile="1"}',
        'lagwatch_replica_lag_window_seconds_count{cluster="main",replica="replica1"}',
        'lagwatch_replica_lag_window_seconds_sum{cluster="main",replica="replica1"}']
    assert "# TYPE lagwatch_replica_lag_window_seconds summary" in text


def test_docs_metrics_is_the_catalogue() -> None:
    """docs/metrics.md is generated from the catalogue: a family added without
    documentation (or documentation left for a family gone) fails here."""
    documented = (ROOT / "docs" / "metrics.md").read_text()
    assert documented == families.markdown(), \
        "run: PYTHONPATH=daemon python3 -m lagwatch.serve.export > docs/metrics.md"
    names = set(re.findall(r"^\| `(lagwatch_\w+)` \|", documented, re.M))
    assert names == {spec.series for spec in families.CATALOGUE.values()}


LEGACY = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def test_every_name_is_a_legacy_name_which_every_escaping_scheme_leaves_alone() -> None:
    """docs/http.md: whatever escaping a Prometheus 3 asks for (allow-utf-8, underscores,
    dots, values), lagwatch's bytes are the same, because no metric or label name needs
    escaping; the label names a histogram or summary adds (le, quantile) are legacy too."""
    for spec in families.CATALOGUE.values():
        assert LEGACY.fullmatch(spec.series), spec.name
        assert spec.labels == tuple(n for n in spec.labels if LEGACY.fullmatch(n) and not n.startswith("__")), spec
