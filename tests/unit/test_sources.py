"""Where the clusters come from (sources.py), with the clock passed in: the cluster
directory looked at once a second, a reload read beside the running sources, a change
that could not be put in force offered again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lagwatch.config import parse_config
from lagwatch.sources.clusters import CLUSTER_DIR_SCAN_SECONDS, ClusterSources


def cluster_yaml(host: str = "p") -> str:
    return f"primary: {{dsn: host={host}}}\nreplicas:\n  - {{name: r1, dsn: host=r1}}\n"


def write(path: Path, text: str) -> None:
    path.write_text(text)
    st = path.stat()  # another second on its clock: a change within one mtime tick is seen too
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def names(config_clusters: tuple[object, ...]) -> list[str]:
    return sorted(c.name for c in config_clusters)  # type: ignore[attr-defined]


def test_the_directory_is_looked_at_once_a_second_of_the_clock_passed_in(tmp_path: Path) -> None:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    write(folder / "east.yaml", cluster_yaml())
    sources = ClusterSources(parse_config({"clusters_dir": str(folder)}), now=100.0)
    assert names(sources.effective().clusters_with_nodes) == ["east"]
    write(folder / "west.yaml", cluster_yaml(host="w"))
    scan = CLUSTER_DIR_SCAN_SECONDS
    # (seconds since the last look, a change seen, clusters in force after)
    table = [(scan / 2, False, ["east"]), (scan, True, ["east", "west"]), (scan * 1.5, False, ["east", "west"])]
    for since, changed, clusters in table:
        assert sources.take_changes(100.0 + since) is changed, since
        assert names(sources.effective().clusters_with_nodes) == clusters, since


def test_a_reload_is_read_beside_the_running_sources_and_adopted_whole(tmp_path: Path) -> None:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    write(folder / "east.yaml", cluster_yaml())
    first = parse_config({"clusters_dir": str(folder)})
    sources = ClusterSources(first, now=0.0)
    write(folder / "west.yaml", cluster_yaml(host="w"))
    reloaded = sources.reloaded(parse_config({"clusters_dir": str(folder),
                                              "clusters": [{"name": "main", "primary": {"dsn": "host=m"}}]}))
    assert names(sources.effective(reloaded.source).clusters_with_nodes) == ["east", "main", "west"]
    assert names(sources.effective().clusters_with_nodes) == ["east"]  # not in force until adopted
    assert [p.rsplit("/", 1)[1] for p, _ in sources.cluster_files()] == ["east.yaml"]
    sources.adopt(reloaded, now=5.0)
    assert names(sources.effective().clusters_with_nodes) == ["east", "main", "west"]
    assert sources.take_changes(5.5) is False  # looked at on adoption: the next look a second on


def test_a_change_that_could_not_be_put_in_force_is_offered_again(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "clusters.d"
    folder.mkdir()
    sources = ClusterSources(parse_config({"clusters_dir": str(folder)}), now=0.0)
    write(folder / "east.yaml", cluster_yaml())
    assert sources.take_changes(1.0) is True
    sources.failed(RuntimeError("a pooler that cannot be built"))
    assert sources.take_changes(2.0) is True  # nothing new in the folder: offered again
    sources.failed(RuntimeError("still cannot"))
    # Said once, with what went wrong, not on every retry.
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].exc_info is not None
    assert "a pooler that cannot be built" in caplog.text and "still cannot" not in caplog.text
    assert sources.take_changes(3.0) is True  # at the next look
    sources.in_force()
    assert sources.take_changes(4.0) is False
