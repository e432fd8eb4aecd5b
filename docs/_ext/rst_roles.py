"""Griffe extension: render the package's reST markup in Google-style docstrings.

The docstrings of ``numpyro_deer`` are Google style (``Args:``, ``Returns:``)
with some reStructuredText inside: roles such as ``:class:`~numpyro_deer.MCMC```,
``:func:`jax.lax.scan``` and ``:math:`\\epsilon```, and ``.. math::`` blocks.
mkdocstrings renders docstrings as Markdown, where those show up verbatim. This
extension rewrites them before rendering, without touching the package:

* a role naming a public object of ``numpyro_deer`` (``numpyro_deer.X``,
  ``numpyro_deer.core.X`` or a bare public name) becomes a cross-reference to
  its entry in the API reference; any other role becomes inline code;
* ``:math:`...``` becomes ``$...$`` and a ``.. math::`` block becomes a
  ``$$...$$`` block (``aligned`` when it has ``&``), for pymdownx.arithmatex.

Enabled in ``mkdocs.yml`` under the python handler's ``extensions``.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|mod|obj|data|exc):`(~?)([^`]+)`")
_MATH_ROLE = re.compile(r":math:`([^`]+)`")
_MATH_BLOCK = re.compile(
    r"^(?P<indent>[ \t]*)\.\. math::[ \t]*\n"
    r"(?P<body>(?:(?P=indent)[ \t]+.*\n|[ \t]*\n)+)",
    re.MULTILINE,
)

# Pages and objects that the API reference documents (see docs/api.md).
_DOCUMENTED_MODULES = ("numpyro_deer", "numpyro_deer.core")


class RstRoles(griffe.Extension):
    """Rewrite reST roles and math blocks in every docstring to Markdown."""

    def __init__(self) -> None:
        super().__init__()
        self._public: dict[str, set[str]] | None = None

    def _public_names(self, loader: griffe.GriffeLoader) -> dict[str, set[str]]:
        if self._public is None:
            self._public = {}
            for name in _DOCUMENTED_MODULES:
                try:
                    module = loader.modules_collection[name]
                    exported = module.exports or ()
                except (KeyError, AttributeError):
                    exported = ()
                self._public[name] = {str(item) for item in exported}
        return self._public

    def _target(self, path: str, loader: griffe.GriffeLoader) -> str | None:
        """The documented identifier for ``path``, or None if it has no entry."""
        public = self._public_names(loader)
        module, _, name = path.rpartition(".")
        if not module:
            for documented in _DOCUMENTED_MODULES:
                if name in public[documented]:
                    return f"{documented}.{name}"
            return None
        if module in public and name in public[module]:
            return path
        if module == "numpyro_deer" and name in public["numpyro_deer.core"]:
            return f"numpyro_deer.core.{name}"
        return None

    def _rewrite(self, text: str, loader: griffe.GriffeLoader) -> str:
        def math_block(match: re.Match) -> str:
            indent = match.group("indent")
            body = textwrap.dedent(match.group("body")).strip("\n")
            if "&" in body:
                body = "\\begin{aligned}\n" + body + "\n\\end{aligned}"
            lines = ["$$", *body.splitlines(), "$$"]
            return "\n".join(indent + line if line else "" for line in lines) + "\n\n"

        def role(match: re.Match) -> str:
            _, tilde, path = match.groups()
            path = path.strip()
            shown = path.rpartition(".")[2] if tilde else path
            target = self._target(path, loader)
            if target is None:
                return f"`{shown}`"
            return f"[`{shown}`][{target}]"

        text = _MATH_BLOCK.sub(math_block, text)
        text = _MATH_ROLE.sub(lambda m: f"${m.group(1)}$", text)
        return _ROLE.sub(role, text)

    def on_object(
        self, *, obj: griffe.Object, loader: griffe.GriffeLoader, **kwargs: Any
    ) -> None:
        if obj.docstring is not None:
            obj.docstring.value = self._rewrite(obj.docstring.value, loader)
