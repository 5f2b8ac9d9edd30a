"""Config problems, reported all at once, each with the path of the key it concerns.

The bottom of the package: the lagwatch config and the web config both report through it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from pydantic import ValidationError

from lagwatch.escape import escape_controls, excerpt


class ConfigError(Exception):
    """A config file that cannot be used; ``problems`` lists every error with its path."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = one_line(source)
        self.problems = [one_line(p) for p in problems]
        super().__init__(f"{source}: " + "; ".join(self.problems))

    def render(self) -> str:
        """One line for the source, one a problem: control characters in either (a file
        name, a key read from the file) escaped, so that none can start a line of its own."""
        lines = [f"{escape_controls(self.source)}: {len(self.problems)} problem(s)"]
        lines += [f"  {escape_controls(p)}" for p in self.problems]
        return "\n".join(lines)


def flat_message(exc: BaseException) -> str:
    """An error's message with its whitespace runs as single spaces: libpq's span several
    indented lines; a node's status and a log line want one."""
    return " ".join(str(exc).split())


def one_line(text: str, limit: int = 500) -> str:
    """``text`` as one printable line of bounded length: a key or value from a hostile file
    must not start a new log line (or a fake one) or flood the terminal."""
    out = escape_controls(text)
    return out if len(out) <= limit else out[:limit] + f"... ({len(out) - limit} more characters)"


def validation_problems(exc: ValidationError, tagged: Mapping[str, Collection[str]] | None = None) -> list[str]:
    """One line per problem. ``tagged``: for a key holding a tagged union (``pooler``),
    the tags pydantic puts into the path after it (``pooler.haproxy.backend``), which
    mean nothing to whoever wrote the file and are left out (``pooler.backend``)."""
    problems = []
    # The inputs are looked at (never shown: they may be secrets) for one thing only: a
    # boolean where words were expected is YAML's reading of an unquoted off/on/no/yes.
    for err in exc.errors(include_url=False):
        loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        loc = tuple(p for i, p in enumerate(loc) if not (i and tagged and _is_tag(tagged, loc[i - 1], p))
                    and not (i > 1 and tagged and isinstance(loc[i - 1], int) and _is_tag(tagged, loc[i - 2], p)))
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        elif err["type"] == "missing":
            msg = "required key is missing"
        elif err["type"] == "literal_error" and isinstance(err.get("input"), bool):
            msg += (f" (YAML reads an unquoted off, no, on or yes as {str(err['input']).lower()}: "
                    "quote the word, as in 'off')")
        problems.append(f"{key_path(loc) or '(top level)'}: {msg}")
    return problems


def _is_tag(tagged: Mapping[str, Collection[str]], key: int | str, part: int | str) -> bool:
    return isinstance(key, str) and isinstance(part, str) and part in tagged.get(key, ())


def key_path(loc: Sequence[int | str]) -> str:
    """``("clusters", 0, "pooler", "backend")`` -> ``clusters[0].pooler.backend``. A key
    is the file's own text where it is unknown (a line of whatever a path led to), so each
    is an excerpt: bounded, escaped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            key = excerpt(part, KEY_EXCERPT)
            out += f".{key}" if out else key
    return out


KEY_EXCERPT = 40  # characters of a key an error message shows
