"""A small Markdown-to-HTML converter for the definitions page embedded in the report.

The report must stay one self-contained file (a link to the installed ``definitions.md`` breaks
once the report is moved or shared), so the page is converted here, with no dependency: headings,
paragraphs, ``-`` / ``1.`` lists (one level, continuation lines joined), pipe tables, fenced code,
`` `code` ``, ``**bold**``, ``*emphasis*`` and ``[text](url)`` links. Every piece of text is
HTML-escaped before markup is added; HTML comments in the source are dropped. Headings get ids
``def-<slug>`` so they can be linked from the report.
"""

from __future__ import annotations

import html
import re

__all__ = ["to_html"]

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_EM = re.compile(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_ITEM = re.compile(r"^\s*(?:[-*]|\d+\.)\s+")


def _inline(text: str) -> str:
    parts = _CODE.split(text)  # odd indices are code spans: escaped, no further markup
    out = []
    for i, part in enumerate(parts):
        if i % 2:
            out.append(f"<code>{html.escape(part)}</code>")
            continue
        s = html.escape(part, quote=False)
        s = _BOLD.sub(r"<strong>\1</strong>", s)
        s = _EM.sub(r"<em>\1</em>", s)
        s = _LINK.sub(lambda m: f'<a href="{html.escape(m.group(2))}">{m.group(1)}</a>'
                      if m.group(2).startswith(("#", "http://", "https://")) else m.group(1), s)
        out.append(s)
    return "".join(out)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60]


def _table(lines: list[str]) -> str:
    def cells(line: str) -> list[str]:
        row = re.split(r"(?<!\\)\|", line.strip().strip("|"))
        return [c.strip().replace("\\|", "|") for c in row]

    head, body = cells(lines[0]), [cells(ln) for ln in lines[2:]]
    th = "".join(f"<th>{_inline(c)}</th>" for c in head)
    trs = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in body)
    return f"<table class='tl glossary'><thead><tr>{th}</tr></thead><tbody>{trs}</tbody></table>"


def to_html(text: str, *, heading_offset: int = 2) -> str:
    """HTML for the Markdown ``text``; heading level ``n`` becomes ``h{n + heading_offset}``
    (capped at ``h6``) so the page nests under the report's own headings."""
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)
    lines = text.splitlines()
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre>" + html.escape("\n".join(lines[i + 1:j])) + "</pre>")
            i = j + 1
            continue
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if m:
            flush()
            level = min(6, len(m.group(1)) + heading_offset)
            title = m.group(2).strip()
            out.append(f"<h{level} id='def-{_slug(title)}'>{_inline(title)}</h{level}>")
        elif line.lstrip().startswith("|") and i + 1 < len(lines) and re.match(r"^\s*\|?\s*:?-{3,}", lines[i + 1]):
            flush()
            j = i
            while j < len(lines) and lines[j].lstrip().startswith("|"):
                j += 1
            out.append(_table(lines[i:j]))
            i = j
            continue
        elif not line.strip():
            flush()
        elif _ITEM.match(line):
            if para:
                flush()
            items.append(_ITEM.sub("", line, count=1))
        elif items and line.startswith((" ", "\t")):
            items[-1] += " " + line.strip()
        else:
            if items:
                flush()
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)
