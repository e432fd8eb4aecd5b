"""Regenerate the printed outputs shown in the documentation pages.

    python docs/generate_outputs.py                 # every page with a marker
    python docs/generate_outputs.py docs/getting-started.md --check

A page marks an output with a line ``<!-- generated-output -->`` directly
above a fenced ``text`` block. The script runs the page's ``python`` blocks in
order, in one namespace, as a reader who copies them would, and replaces each
marked ``text`` block with what the ``python`` blocks between the previous
marker and this one printed to standard output (blocks after the last marker
do not run). The outputs are therefore
those of the code on the page, on the machine that ran this script (the
printed numbers depend on the platform and the JAX version; the script prints
both). With ``--check`` nothing is written, and the exit status is 1 if a
page's outputs differ from what is stored.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
MARKER = "<!-- generated-output -->"
# a python block, or a marker with the text block it owns
BLOCK = re.compile(
    r"^```python\n(?P<code>.*?)^```\n"
    r"|^" + re.escape(MARKER) + r"\n```text\n(?P<output>.*?)^```\n",
    re.S | re.M,
)


def generate(text: str, name: str) -> str:
    """The page ``text`` with every marked output block regenerated."""
    namespace: dict = {"__name__": f"docs:{name}"}
    printed = io.StringIO()
    pieces, last = [], 0
    remaining = text.count(MARKER)
    for match in BLOCK.finditer(text):
        if remaining == 0:
            break  # blocks after the last marker are not run
        if match.group("code") is not None:
            with contextlib.redirect_stdout(printed):
                exec(compile(match.group("code"), name, "exec"), namespace)
            continue
        # without the blank lines around it (print_summary starts with one)
        output = printed.getvalue().strip("\n") + "\n"
        start = match.start("output")
        pieces += [text[last:start], output]
        last = match.end("output")
        printed = io.StringIO()
        remaining -= 1
    pieces.append(text[last:])
    return "".join(pieces)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="*", type=Path)
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    pages = args.pages or sorted(
        p for p in DOCS.glob("*.md") if MARKER in p.read_text()
    )
    sys.path.insert(0, str(ROOT))  # the working tree's package
    import jax
    import numpyro

    backend = jax.default_backend()
    print(f"jax {jax.__version__} ({backend}), numpyro {numpyro.__version__}")
    differ = False
    for page in pages:
        text = page.read_text()
        if MARKER not in text:
            print(f"{page}: no {MARKER} marker", file=sys.stderr)
            return 2
        new = generate(text, page.name)
        changed = new != text
        differ |= changed
        if args.check:
            print(f"{page}: {'differs' if changed else 'up to date'}")
        else:
            page.write_text(new)
            print(f"{page}: {'rewritten' if changed else 'unchanged'}")
    return int(args.check and differ)


if __name__ == "__main__":
    sys.exit(main())
