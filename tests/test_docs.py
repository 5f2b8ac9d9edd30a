"""The documentation holds together: a README read in ten minutes over docs/ pages, every
relative link and anchor resolving inside the repository, and the README's set-up commands
(which .ci/run must run exactly) still there. No servers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
SETUP_COMMANDS = (
    "```sh\npip install '.[embedded]' && lagwatch demo\n```",
    "```sh\nbash tests/setup-machine.sh && python3 -m pytest\n```",
)

FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
LINK = re.compile(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.M)


def prose(text: str) -> str:
    """The text outside fenced code blocks (a YAML comment is no heading, a shell line no link)."""
    return FENCE.sub("", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (links by their text, no code or
    emphasis marks), lowercased, punctuation other than '-' and '_' dropped, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for heading in HEADING.findall(prose(path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[str]:
    links = LINK.findall(prose(path.read_text()))
    return [link for link in links if not re.match(r"^(https?:|mailto:)", link, re.I)]


def test_slug_is_githubs() -> None:
    assert slug("Many clusters: `clusters_dir`") == "many-clusters-clusters_dir"
    assert slug("Will it catch up, and will the slot last?") == "will-it-catch-up-and-will-the-slot-last"
    assert slug("`lagwatch check`") == "lagwatch-check"
    assert slug("Install on a Debian host (systemd, PgBouncer beside it)") == \
        "install-on-a-debian-host-systemd-pgbouncer-beside-it"


def test_the_readme_is_a_ten_minute_read() -> None:
    lines = README.read_text().count("\n")
    assert lines < 300, f"README.md has {lines} lines: move detail into docs/"


def test_the_readme_keeps_its_setup_commands() -> None:
    text = README.read_text()
    for block in SETUP_COMMANDS:
        assert block in text, f"README.md lost its set-up command block:\n{block}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(page: Path) -> None:
    assert "../shared" not in page.read_text(), f"{page.relative_to(ROOT)} mentions ../shared"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    problems = []
    for link in relative_links(page):
        target, _, anchor = link.partition("#")
        if link.startswith("/"):
            problems.append(f"{link}: absolute path; link relative to the page")
            continue
        path = (page.parent / target).resolve() if target else page
        if ROOT != path and ROOT not in path.parents:
            problems.append(f"{link}: outside the repository")
        elif not path.is_file():
            problems.append(f"{link}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            problems.append(f"{link}: no heading in {path.relative_to(ROOT)} makes #{anchor}")
        elif anchor and path.suffix != ".md":
            problems.append(f"{link}: an anchor into a file that is not markdown")
    assert not problems, f"{page.relative_to(ROOT)}:\n" + "\n".join(problems)


def test_every_docs_page_is_reachable_from_the_readme() -> None:
    linked = {(README.parent / link.partition("#")[0]).resolve() for link in relative_links(README)}
    missing = [p.relative_to(ROOT) for p in PAGES[1:] if p.resolve() not in linked]
    assert not missing, f"docs pages the README's list does not link: {missing}"
