"""clusters_dir read file by file: added, changed, broken (the last good version stays),
new and broken (skipped), removed, names taken twice, editor leftovers ignored."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from lagwatch.config import ClusterConfig, parse_config
from lagwatch.errors import ConfigError
from lagwatch.sources.clusterdir import ClusterDir, parse_cluster_file, with_cluster_dir


def cluster_yaml(host: str = "p", replicas: int = 1, name: str | None = None) -> str:
    lines = ([f"name: {name}"] if name else []) + [f"primary: {{dsn: host={host}}}", "replicas:"]
    lines += [f"  - {{name: r{i}, dsn: host=r{i}}}" for i in range(1, replicas + 1)]
    return "\n".join(lines) + "\n"


def write(path: Path, text: str) -> None:
    path.write_text(text)
    # Another second on the clock: a change within one mtime tick must still be seen (size differs here).
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def names(d: ClusterDir) -> list[str]:
    return [c.name for c in d.clusters]


def test_files_come_and_go_and_a_broken_one_keeps_its_last_good_version(tmp_path: Path) -> None:
    d = ClusterDir(tmp_path)
    assert d.scan() is False and d.clusters == ()
    write(tmp_path / "alpha.yaml", cluster_yaml())
    write(tmp_path / "beta.yml", cluster_yaml(name="b"))
    write(tmp_path / ".alpha.yaml.swp", "junk")  # editors' leftovers are not cluster files
    write(tmp_path / "notes.txt", "junk")
    assert d.scan() is True
    assert names(d) == ["alpha", "b"]  # the name defaults to the file's
    assert d.scan() is False  # nothing changed, nothing re-read

    write(tmp_path / "alpha.yaml", cluster_yaml(replicas=2))
    assert d.scan() is True
    alpha = d.clusters[0]
    assert isinstance(alpha, ClusterConfig) and [r.name for r in alpha.replicas] == ["r1", "r2"]

    write(tmp_path / "alpha.yaml", "primary: {dsn: ''}\nreplicas: nope\n")
    assert d.scan() is False  # broken: the last good version stays in force
    assert d.clusters[0] == alpha
    (standing,) = [f for f in d.files if f.path.endswith("alpha.yaml")]
    assert standing.cluster == alpha and standing.error is not None
    assert "primary.dsn: must not be empty" in standing.error and "replicas:" in standing.error

    write(tmp_path / "gamma.yaml", "primary: [\n")  # new and broken: skipped
    assert d.scan() is False and names(d) == ["alpha", "b"]
    (gamma,) = [f for f in d.files if f.path.endswith("gamma.yaml")]
    assert gamma.cluster is None and gamma.error is not None and "not valid YAML" in gamma.error

    (tmp_path / "beta.yml").unlink()
    assert d.scan() is True and names(d) == ["alpha"]
    write(tmp_path / "gamma.yaml", cluster_yaml(host="g"))
    write(tmp_path / "alpha.yaml", cluster_yaml(replicas=2))
    assert d.scan() is True and names(d) == ["alpha", "gamma"]
    assert all(f.error is None for f in d.files)


def test_a_name_taken_keeps_the_later_file_out_until_it_is_free(tmp_path: Path) -> None:
    write(tmp_path / "a.yaml", cluster_yaml(name="shared"))
    write(tmp_path / "b.yaml", cluster_yaml(name="shared", host="other"))
    write(tmp_path / "main.yaml", cluster_yaml())
    d = ClusterDir(tmp_path)
    d.scan(reserved={"main"})
    assert names(d) == ["shared"] and d.clusters[0].primary.dsn == "host=p"  # type: ignore[union-attr]
    errors = {Path(f.path).name: f.error for f in d.files}
    assert errors["b.yaml"] == f"name: cluster name 'shared' is already used by {tmp_path / 'a.yaml'}"
    assert errors["main.yaml"] == "name: cluster name 'main' is already used by the main config"
    (tmp_path / "a.yaml").unlink()
    assert d.scan(reserved={"main"}) is True  # b.yaml was never re-read, yet now it is in force
    assert d.clusters[0].primary.dsn == "host=other"  # type: ignore[union-attr]


def test_a_directory_that_cannot_be_read_keeps_what_is_in_force(tmp_path: Path) -> None:
    folder = tmp_path / "clusters"
    folder.mkdir()
    write(folder / "a.yaml", cluster_yaml())
    d = ClusterDir(folder)
    d.scan()
    (folder / "a.yaml").unlink()
    folder.rmdir()
    assert d.scan() is False and names(d) == ["a"]


def test_patroni_clusters_and_problems_named_as_in_the_main_config(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("discovery: {kind: patroni, urls: ['http://10.0.0.1:8008']}\nmembers: {dsn: user=lw}\n")
    assert parse_cluster_file(path).name == "p"
    path.write_text("primary: {dsn: host=p}\npooler: {kind: haproxy, backend: b}\n")
    with pytest.raises(ConfigError) as caught:
        parse_cluster_file(path)
    assert "pooler.socket: required key is missing" in caught.value.problems
    path.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping of one cluster"):
        parse_cluster_file(path)


def test_one_shot_commands_see_the_main_file_and_the_directory(tmp_path: Path) -> None:
    folder = tmp_path / "clusters"
    folder.mkdir()
    write(folder / "east.yaml", cluster_yaml())
    config = parse_config({"clusters_dir": str(folder)})
    merged, files = with_cluster_dir(config)
    assert [c.name for c in merged.clusters_with_nodes] == ["east"] and len(files) == 1
    with pytest.raises(ConfigError) as caught:
        parse_config({"clusters_dir": str(tmp_path / "nope")})
    assert any(p.startswith("clusters_dir: ") and "is not a directory" in p for p in caught.value.problems)


def test_the_daemon_runs_the_directory_s_clusters_from_the_start_and_follows_it(tmp_path: Path) -> None:
    """No server needed: which clusters the daemon's runtime holds (it would poll) as files
    come and go; a broken one changes nothing in force."""
    import asyncio
    import time

    from lagwatch.daemon import Daemon
    from lagwatch.sources.clusters import CLUSTER_DIR_SCAN_SECONDS

    folder = tmp_path / "clusters.d"
    folder.mkdir()
    write(folder / "east.yaml", cluster_yaml())
    config = parse_config({"clusters_dir": str(folder), "state_dir": str(tmp_path / "state"),
                           "clusters": [{"name": "main", "primary": {"dsn": "host=m"}}]})

    async def run() -> None:
        d = Daemon(config)
        in_force = lambda: sorted(c.name for c in d.config.clusters_with_nodes)  # noqa: E731
        assert in_force() == ["east", "main"]  # the directory's cluster from the start
        now = time.monotonic()
        write(folder / "west.yaml", cluster_yaml(host="w"))
        await d.take_changes(now)  # less than a second since the last look: not looked at
        assert in_force() == ["east", "main"]
        now += CLUSTER_DIR_SCAN_SECONDS  # a second has passed
        await d.take_changes(now)
        assert in_force() == ["east", "main", "west"] and sorted(d.runtime.pollers) == ["east", "main", "west"]
        write(folder / "west.yaml", "primary: [\n")
        now += CLUSTER_DIR_SCAN_SECONDS
        await d.take_changes(now)
        assert in_force() == ["east", "main", "west"]  # its last good version
        (folder / "east.yaml").unlink()
        now += CLUSTER_DIR_SCAN_SECONDS
        await d.take_changes(now)
        assert in_force() == ["main", "west"]
        assert [path.rsplit("/", 1)[1] for path, _ in d.sources.cluster_files()] == ["west.yaml"]
        await d.close()

    asyncio.run(run())
