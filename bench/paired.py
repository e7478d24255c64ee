"""Paired drains of two checkouts, alternating, in one sitting.

Usage (from the root of the checkout with the change)::

    git worktree add ../before HEAD~1
    python -m bench.paired --before ../before --rounds 6 -- --shapes full:16

Runs :mod:`bench.drains` (its options after ``--``) on the ``--before`` checkout's jobguard
and on this one's, ``--rounds`` times, the order turned each round (before first, then after
first: a drain run right after another can run slower), and prints every run's line marked
``before`` or ``after``. This machine's speed drifts by a third within minutes, so a change
is judged only against the runs beside it. The bench's own modules come from this checkout on
both sides; only ``jobguard`` differs (its ``src`` first on ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from bench.procs import REPO_ROOT


def main() -> None:
    """Alternate the two checkouts' drains."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="checkout of the base commit")
    parser.add_argument("--rounds", type=int, default=4, help="pairs of runs")
    parser.add_argument("drains", nargs=argparse.REMAINDER, help="-- then bench.drains options")
    args = parser.parse_args()
    before = args.before.resolve()
    if not (before / "src" / "jobguard" / "__init__.py").is_file():
        raise SystemExit(f"--before {args.before}: not a jobguard checkout (no src/jobguard)")
    options = [part for part in args.drains if part != "--"]
    sides = [("before", before), ("after", REPO_ROOT)]
    for round_number in range(args.rounds):
        # The order turns each round: of two drains run back to back, the second ran slower
        # (round_trips-2026-12-06-indexes.txt), so a fixed order would favour one side.
        for label, checkout in sides if round_number % 2 == 0 else sides[::-1]:
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join([str(checkout / "src"), str(REPO_ROOT)]),
            }
            command = [sys.executable, "-m", "bench.drains", "--label", f"{label:6} ", *options]
            done = subprocess.run(command, cwd=REPO_ROOT, env=env, check=False)
            if done.returncode != 0:
                raise SystemExit(f"bench.drains on the {label} checkout exited {done.returncode}")


if __name__ == "__main__":
    main()
