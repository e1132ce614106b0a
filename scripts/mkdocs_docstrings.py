"""A griffe extension for the API reference (mkdocs.yml): wirekit's docstrings as Markdown.

wirekit's docstrings are written for ``help()`` and doctest: ``>>>`` examples at the margin
and Sphinx roles (``:func:`name```).  Rendered as Markdown, an example's output such as
``['', '03000000']`` reads as a link and fails ``mkdocs build --strict``.  This extension
fences each run of ``>>>``/``...`` lines and their output as a ``pycon`` block, and turns a
role into a code span (the name alone, as Sphinx shows ``~`` targets).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|exc|data|obj|const):`(~?)([^`]+)`")


def _role(match: re.Match[str]) -> str:
    target = match.group(2)
    return f"`{target.rsplit('.', 1)[-1] if match.group(1) else target}`"


def markdown_docstring(text: str) -> str:
    """``text`` with its doctest examples fenced and its Sphinx roles as code spans."""
    out: list[str] = []
    in_example = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith(">>>") and not in_example:
            out.append("```pycon")
            in_example = True
        elif in_example and not stripped:
            out.append("```")
            in_example = False
        out.append(line if in_example else _ROLE.sub(_role, line))
    if in_example:
        out.append("```")
    return "\n".join(out)


class DocstringsAsMarkdown(griffe.Extension):
    """Rewrites every loaded object's docstring with :func:`markdown_docstring`."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown_docstring(obj.docstring.value)
