"""validate, check, run and a reload agree on every file of the corpus (config_corpus.py),
and none of them ever prints a traceback."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from chaoscluster import ChaosCluster
from config_corpus import SECRET, Case, build
from harness import Lagwatch, cluster_config, run_cli
from lagwatch.cli import main
from lagwatch.demo.ports import free_port

pytestmark = pytest.mark.one_pg_version


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> list[Case]:
    return build(tmp_path_factory.mktemp("corpus"), free_port(["127.0.0.1"]))


def test_the_corpus_is_big_enough(corpus: list[Case]) -> None:
    assert sum(not c.good for c in corpus) >= 40
    assert sum(c.good for c in corpus) >= 8
    assert {c.name for c in corpus} >= {f"pooler-{k}" for k in ("pgbouncer", "haproxy", "pgcat", "pgdog", "command")}


def _verdict(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err, out
    assert SECRET not in out.out + out.err, out
    return code, out.err


def test_validate_check_and_run_agree_on_every_file(corpus: list[Case], capsys: pytest.CaptureFixture[str]) -> None:
    disagree = []
    for case in corpus:
        code, err = _verdict(capsys, "validate", "-c", str(case.path))
        if case.good != (code == 0) or (not case.good and (code != 2 or case.needle not in err)):
            disagree.append(f"validate {case.name}: exit {code}, {err.strip()!r}")
        if case.good:
            continue  # check and run of a good file poll servers: the reload test below takes them
        for command in ("check", "run"):
            code, err = _verdict(capsys, command, "-c", str(case.path))
            if code != 2 or case.needle not in err:
                disagree.append(f"{command} {case.name}: exit {code}, {err.strip()!r}")
    assert not disagree, "\n".join(disagree)


def test_check_accepts_every_good_file(corpus: list[Case]) -> None:
    """A good file gets a poll (of nothing that answers), never a config error."""
    for case in corpus:
        if case.good and case.name in ("base", "pooler-pgbouncer", "with-web-config"):
            out = run_cli("check", "-c", str(case.path))
            assert out.returncode in (0, 1, 2, 3) and "problem(s)" not in out.stderr, (case.name, out.stderr)
            assert "Traceback" not in out.stderr, out.stderr


def reload_lines(lw: Lagwatch) -> list[str]:
    return [line for line in lw.log_text().splitlines()
            if "lagwatch.reload: reloaded " in line or "lagwatch.reload: reload rejected" in line]


def test_a_running_daemon_reloads_exactly_the_good_files(pg_cluster: ChaosCluster, corpus: list[Case],
                                                         tmp_path: Path) -> None:
    """One `lagwatch run`, every corpus file written over its config and SIGHUP: the good
    ones are put in force, the bad ones rejected with the same problem validate reports,
    and the daemon keeps answering throughout."""
    with Lagwatch.for_cluster(tmp_path, pg_cluster) as lw:
        lw.wait_ready()
        listen = f"127.0.0.1:{lw.port}"
        auth_in_force = False
        for case in corpus:
            before = len(reload_lines(lw))
            lw.config_path.write_bytes(case.path.read_bytes())
            lw.signal(signal.SIGHUP)
            lw.wait_for(f"the reload of {case.name}", lambda before=before: len(reload_lines(lw)) > before,
                        timeout=10)
            last = reload_lines(lw)[-1]
            if case.good:
                assert "lagwatch.reload: reloaded " in last, (case.name, last)
                # Its web config came with it: basic auth in force, or gone again.
                auth_in_force = "web_config_file" in case.path.read_text().replace("#web_config_file", "")
            else:
                assert "reload rejected" in last and case.needle in last, (case.name, last)
            assert lw.get("/healthz")[0] == (401 if auth_in_force else 200), case.name
        assert "Traceback" not in lw.log_text() and SECRET not in lw.log_text()
        # Back to the cluster: it polls it again.
        lw.write_config(cluster_config(pg_cluster, int(listen.rsplit(":", 1)[1])))
        lw.signal(signal.SIGHUP)
        lw.wait_for("polling the cluster again", lambda: lw.value("lagwatch_up", node="replica1") == 1, timeout=15)
        assert lw.value("lagwatch_config_last_reload_successful") is None  # a daemon-wide metric
        assert lw.daemon_value("lagwatch_config_last_reload_successful") == 1
