"""Fuzz run: many hostile config and web config files through `lagwatch validate`, with the
same generator and property as the test suite's fixed-seed run (tests/unit/test_hostile_input.py):
exit 0, or exit 2 with one printable line per problem; never a traceback, never a hang.
Prints how many cases were tried, their outcomes and any failure. It asserts nothing.

    python3 bench/fuzz.py [--cases 5000] [--seed 1] [--seconds-per-case 10]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import io
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "daemon"))
sys.path.insert(0, str(ROOT / "tests"))

import yaml  # noqa: E402
from hostile_configs import Generator, check_output  # noqa: E402
from lagwatch.cli import main as lagwatch  # noqa: E402


class HangError(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise HangError


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=5000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--seconds-per-case", type=int, default=10)
    args = parser.parse_args()
    signal.signal(signal.SIGALRM, _alarm)
    outcomes: collections.Counter[str] = collections.Counter()
    mutations: collections.Counter[str] = collections.Counter()
    failures: list[str] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        generator = Generator(args.seed, folder / "fuzz")
        good = folder / "good.yaml"
        good.write_text(yaml.safe_dump({"listen": "127.0.0.1:9", "clusters": [
            {"name": "main", "primary": {"dsn": "host=127.0.0.1 port=1"}}]}))
        for i in range(args.cases):
            case = generator.case()
            for mutation in case.mutations:
                mutations[mutation.split(" ")[0]] += 1
            path = folder / "case.yaml"
            path.write_bytes(case.data)
            argv = ["validate", "-c", str(good), "--web.config.file", str(path)] if case.kind == "web" \
                else ["validate", "-c", str(path)]
            err = io.StringIO()
            signal.alarm(args.seconds_per_case)
            try:
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    code = lagwatch(argv)
                wrong = check_output(code, err.getvalue())
                outcomes[f"{case.kind}: exit {code}" if wrong is None else f"{case.kind}: FAILED ({wrong})"] += 1
            except HangError:
                wrong = "hang"
                outcomes[f"{case.kind}: FAILED (hang)"] += 1
            except BaseException as exc:  # the property: nothing escapes
                wrong = f"{type(exc).__name__}: {exc}"[:300]
                outcomes[f"{case.kind}: FAILED (exception)"] += 1
            finally:
                signal.alarm(0)
            if wrong is not None:
                failures.append(f"seed {args.seed} case {i} {case.kind} {case.mutations}: {wrong}")
    elapsed = time.monotonic() - started
    print(f"{args.cases} cases (seed {args.seed}) in {elapsed:.1f} s")
    for outcome, count in sorted(outcomes.items()):
        print(f"  {outcome:40} {count:6}")
    print("mutations applied:", ", ".join(f"{m} {n}" for m, n in sorted(mutations.items())))
    for failure in failures[:20]:
        print("  " + failure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
