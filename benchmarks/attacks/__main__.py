"""``python -m benchmarks.attacks [--short] [--only NAME ...] [--markdown] [--json FILE]``"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from . import ATTACKS, KNOWN_OPEN
from .harness import FULL, MB, SHORT, Result, dump, run_attack

__all__ = ["main", "markdown"]


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f} s"


def markdown(results: Sequence[Result], command: str) -> str:
    """The table for ``docs/security.md``, with the command line above it."""
    lines = [
        f"`{command}`",
        "",
        "| attack | finding | size | peak RSS over idle | RSS after, over idle "
        "| probe p50 / max | refused after | verdict |",
        "| --- | --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for r in results:
        refused = ", ".join(sorted(r.refused)) or "no"
        verdict = "pass" if r.passed else "FAIL: " + "; ".join(r.failures)
        if r.cut:
            verdict += f" (stopped at the {r.cut})"
        lines.append(
            f"| {r.name} | {r.finding} | {r.size} | {r.peak_over_idle / MB:,.0f} MB "
            f"| {r.after_over_idle / MB:,.0f} MB | {_s(r.probe_p50)} / {_s(r.probe_max)} "
            f"| {refused} | {verdict} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.attacks", description=__doc__)
    parser.add_argument("--short", action="store_true", help="small sizes, small max_memory")
    parser.add_argument("--only", action="append", metavar="NAME", help="one attack (repeat)")
    parser.add_argument("--markdown", action="store_true", help="print the table")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--logs", type=Path, help="keep the processes' stderr here")
    args = parser.parse_args(argv)
    names = [a.name for a in ATTACKS]
    unknown = sorted(set(args.only or ()) - set(names))
    if unknown:
        parser.error(f"unknown attack(s) {unknown}; known: {', '.join(names)}")
    settings = SHORT if args.short else FULL
    chosen = [a for a in ATTACKS if not args.only or a.name in args.only]
    results: list[Result] = []
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
    for attack in chosen:
        result = run_attack(attack, settings, args.logs)
        results.append(result)
        open_ = " (known open)" if attack.name in KNOWN_OPEN else ""
        verdict = "pass" if result.passed else "FAIL " + "; ".join(result.failures)
        print(
            f"{attack.name}: +{result.peak_over_idle / MB:.0f} MB peak, "
            f"+{result.after_over_idle / MB:.0f} MB after, probe max {_s(result.probe_max)}, "
            f"{result.seconds:.1f} s: {verdict}{open_}",
            file=sys.stderr,
            flush=True,
        )
    if args.json:
        args.json.write_text(dump(results))
    if args.markdown:
        command = "python -m benchmarks.attacks" + (" --short" if args.short else "")
        command += "".join(f" --only {n}" for n in args.only or ()) + " --markdown"
        print(markdown(results, command))


if __name__ == "__main__":
    main()
