"""The one place a YAML file an operator wrote (the config, the web config) is read.

A config file is small, hand-written text. Anything else gets one clear line, never a
traceback or a hang: a FIFO or a device (``/dev/zero``) is refused before it is read, the
size is capped, bytes must be UTF-8 (the error gives the byte offset), nesting and the
number of values (YAML aliases can multiply them) are capped before anything walks them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from lagwatch.errors import ConfigError

MAX_BYTES = 1 << 20  # 1 MiB: a config for hundreds of clusters is a few hundred KiB
MAX_DEPTH = 64  # lagwatch's own schema nests 6 deep
MAX_VALUES = 200_000  # after YAML aliases are expanded


def read_text(path: Path, max_bytes: int = MAX_BYTES, inside: Path | None = None) -> str:
    """The file's text, or ConfigError with one problem saying what is wrong with it.

    ``inside``: a directory the file must be in (clusters_dir). The file is then opened by
    its resolved name without following a link at its last step (``O_NOFOLLOW``), and what
    was opened is checked to be inside, by the name the kernel gives the open descriptor,
    before a byte is read: a link swapped in after any check of the name and before the
    open (a race a stat-then-open loses) cannot make lagwatch read a file outside."""
    source = str(path)
    # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
    target = path
    try:
        if inside is not None:
            target, flags = Path(os.path.realpath(path)), flags | os.O_NOFOLLOW
        fd = os.open(target, flags)
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror or exc}"]) from None
    try:
        if inside is not None and not _opened_inside(fd, target, inside):
            raise ConfigError(source, ["a file outside the directory: not read (only files inside it are)"])
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ConfigError(source, [f"cannot read file: {_kind(mode)}, not a regular file"])
        os.set_blocking(fd, True)
        data = b""
        while len(data) <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - len(data))
            if not chunk:
                break
            data += chunk
    except OSError as exc:
        raise ConfigError(source, [f"cannot read file: {exc.strerror or exc}"]) from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise ConfigError(source, [f"larger than {max_bytes // 1024} KiB: not a config file?"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ConfigError(source, [f"not UTF-8: byte 0x{data[exc.start]:02x} at offset {exc.start} "
                                   f"(line {line}, byte {column} of the line)"]) from None


def _opened_inside(fd: int, opened: Path, directory: Path) -> bool:
    """Whether the open descriptor ``fd`` is a file inside ``directory``: by the path the
    kernel holds for it (/proc/self/fd, Linux); elsewhere, by the same inode as ``opened``
    now has, which only narrows the race."""
    root = os.path.realpath(directory)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        try:
            st, now = os.fstat(fd), os.stat(opened, follow_symlinks=False)
        except OSError:
            return False
        real = str(opened) if (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino) else "/"
    return os.path.commonpath([root, real]) == root


def load_yaml(path: Path, max_bytes: int = MAX_BYTES, inside: Path | None = None) -> Any:
    """The file's YAML document (None when empty), read through ``read_text``."""
    source = str(path)
    text = read_text(path, max_bytes, inside)
    try:
        _check_depth(yaml.parse(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        at = f"line {where.line + 1}, column {where.column + 1}: " if where else ""
        raise ConfigError(source, [f"{at}not valid YAML ({getattr(exc, 'problem', None) or exc})"]) from None
    except _TooDeep as exc:
        raise ConfigError(source, [f"line {exc.line}: nested more than {MAX_DEPTH} levels deep"]) from None
    except ValueError as exc:
        # int() refuses numbers of more than 4,300 digits (CVE-2020-10735); YAML has no line here.
        raise ConfigError(source, [f"a value cannot be read: {str(exc).split(';')[0]}"]) from None
    if _count_values(data) > MAX_VALUES:
        raise ConfigError(source, [f"more than {MAX_VALUES} values once YAML aliases are expanded"])
    return data


class _TooDeep(Exception):  # noqa: N818 - private, never escapes load_yaml
    def __init__(self, line: int) -> None:
        self.line = line


def _check_depth(events: Iterator[yaml.Event]) -> None:
    # The event parser keeps an explicit stack; only the composer that builds the values
    # recurses (RecursionError near 1,000 levels), so depth is checked on the events first.
    depth = 0
    for event in events:
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            depth += 1
            if depth > MAX_DEPTH:
                raise _TooDeep(event.start_mark.line + 1 if event.start_mark else 0)
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            depth -= 1


def _count_values(data: Any) -> int:
    """Values as a walk over them would see them, stopping once past the cap."""
    count, stack = 0, [data]
    while stack and count <= MAX_VALUES:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.keys())
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"
