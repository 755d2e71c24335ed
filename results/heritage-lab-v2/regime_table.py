"""The regime of G_L and G_(L-1) per arm and budget, and whether any knob flips it (PLAN.md's rule).

    python results/heritage-lab-v2/regime_table.py [RUNS.csv ...]

Without arguments it reads this folder's runs.csv (budgets 150 / 300 / 600) and, when it exists,
the longer budgets' runs.csv of Amendment 1 (budgets 1200 / 2400; ``runs-long.csv`` or
``long/runs.csv`` here). Each arm and budget needs all 12 seeds finished for a regime (the
amendment's stopping rule); a cell with fewer says "incomplete". The rule and the table:
:mod:`thermo_lens.experiments.lab.regimes`. Nothing is written; it prints.
"""

from __future__ import annotations

import sys
from pathlib import Path

from thermo_lens.experiments.lab.regimes import arm_regimes, format_regimes, knob_flips, read_runs

HERE = Path(__file__).resolve().parent
SEEDS = 12  # PLAN.md: seeds 1-12 for every arm and budget


def main(argv: list[str]) -> str:
    paths = [Path(a) for a in argv] or [HERE / "runs.csv"] + [
        p for p in (HERE / "runs-long.csv", HERE / "long" / "runs.csv") if p.is_file()]
    runs = read_runs(paths)
    regimes = arm_regimes(runs, min_seeds=SEEDS)
    text = "from: " + ", ".join(str(p) for p in paths) + "\n" + format_regimes(regimes, knob_flips(regimes))
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
