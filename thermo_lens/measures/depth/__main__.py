"""``python -m thermo_lens.measures.depth [--write]``: print (or write) the generated L* text.

The L* rules' Markdown (:func:`thermo_lens.measures.depth.rules.rules_markdown`) sits between markers in
``thermo_lens/definitions.md`` §4; ``--write`` regenerates it (and ``README.md`` of a source checkout, where it
carries the markers).
"""

from __future__ import annotations

import sys
from pathlib import Path

from thermo_lens.measures.depth.rules import RULES_BEGIN, RULES_END, rules_markdown

def render(text: str, indent: str) -> str:
    """``text`` with the block between the L* markers regenerated (unchanged when it has none)."""
    head, found, rest = text.partition(RULES_BEGIN)
    if not found:
        return text
    _, _, tail = rest.partition(RULES_END)
    return f"{head}{RULES_BEGIN}\n{rules_markdown(indent)}\n{indent}{RULES_END}{tail}"


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if "--write" not in args:
        print(rules_markdown())
        return
    pkg = Path(__file__).resolve().parents[2]
    for path, indent in ((pkg / "definitions.md", ""), (pkg.parent / "README.md", "  ")):  # README nests it
        if path.is_file() and RULES_BEGIN in path.read_text(encoding="utf-8"):
            path.write_text(render(path.read_text(encoding="utf-8"), indent), encoding="utf-8")
            print(f"wrote {path}")


if __name__ == "__main__":
    main()
