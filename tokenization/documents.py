"""A folder of documents as people keep them: `openrealm corpus build --input DIR` (and corpus add / update).

    openrealm corpus build --input my_notes/ --tokenizer MODEL --output my_corpus

Every file under the folder (recursively, in path order; hidden files and folders such as .git left out) with a
document suffix is an article: `.txt`, `.md` / `.markdown`, `.html` / `.htm`, and `.pdf` through pypdf (`pip install
"openrealm[pdf]"`). Its title is the document's own (Markdown's first heading, HTML's <title>, the PDF's metadata
title), else its file name without the suffix; its text is what a reader sees: HTML without tags, scripts and
styles; Markdown without the syntax that is not text (heading marks, emphasis, link targets, list and quote marks,
code fences, YAML front matter). Entities are unescaped by the corpus build, as for every article. Each article keeps
the file's path relative to the folder as its passage id (read with --passages-as-blocks).

A file that cannot be read as a document (unreadable, empty, binary, not UTF-8, a PDF without pypdf or without a text
layer) is left out and counted in one summary line naming the first few (`DocumentFolder.summary`); a folder in which
no file can be read is an error.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

DOCUMENT_SUFFIXES = {
    ".txt": "text", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html", ".pdf": "pdf"
}  # fmt: skip
NAMED_IN_SUMMARY = 3  # paths named per reason in the summary line
_SNIFF_BYTES = 8192  # a NUL byte in the first 8 KiB marks a binary file


@dataclass
class DocumentFolder:
    """The documents of one folder, read one at a time: iterating yields {"title", "text", "path"} in path order
    (`path` relative to `root`, with "/"), counts what it yields in `num_read` and what it leaves out in `skipped`
    {reason: [relative paths]} (files of other types as "not a document type"). It holds one document at a time,
    and the list of the folder's paths."""

    root: Path
    num_read: int = 0
    skipped: dict[str, list[str]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[dict[str, str]]:
        self.num_read, self.skipped = 0, {}
        for path in _files(self.root):
            relative = path.relative_to(self.root).as_posix()
            kind = DOCUMENT_SUFFIXES.get(path.suffix.lower())
            try:
                if kind is None:
                    raise DocumentError("not a document type")
                title, text = read_document(path, kind)
            except DocumentError as error:
                self.skipped.setdefault(error.reason, []).append(relative)
                continue
            self.num_read += 1
            yield {"title": title or path.stem, "text": text, "path": relative}

    def summary(self) -> str:
        """One line: how many documents were read and which files were left out, and why (the first few of each)."""
        parts = []
        for reason, paths in sorted(self.skipped.items()):
            named = ", ".join(paths[:NAMED_IN_SUMMARY]) + (", ..." if len(paths) > NAMED_IN_SUMMARY else "")
            parts.append(f"{len(paths)} {reason} ({named})")
        read = f"{self.root}: read {self.num_read} document(s)"
        if not parts:
            return read
        return f"{read}; left out {sum(len(p) for p in self.skipped.values())} file(s): " + "; ".join(parts)

    def check_read(self) -> None:
        """After iterating: a ValueError naming the folder and what it holds when no document could be read."""
        if not self.num_read:
            raise ValueError(f"no readable document (.txt, .md, .html, .pdf) in {self.summary()}")


def is_document_folder(path: str | os.PathLike) -> bool:
    """A folder that is not a datasets `save_to_disk` folder (which holds dataset_info.json or dataset_dict.json)."""
    path = Path(path)
    return path.is_dir() and not any((path / name).is_file() for name in ("dataset_info.json", "dataset_dict.json"))


def read_document_folder(root: str | os.PathLike) -> tuple[list[dict[str, str]], DocumentFolder]:
    """Every document under `root` at once (for small folders; a corpus build streams DocumentFolder): (articles,
    the folder with its counts). Raises ValueError when none can be read."""
    folder = DocumentFolder(Path(root))
    articles = list(folder)
    folder.check_read()
    return articles, folder


class DocumentError(Exception):
    """A file left out of a document folder; `reason` is what the summary line counts it under."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def read_document(path: Path, kind: str) -> tuple[str, str]:
    """(title or "", text) of one document of `kind` ("text", "markdown", "html", "pdf"); DocumentError if it has no
    text to read."""
    if kind == "pdf":
        title, text = _read_pdf(path)
    else:
        raw = _read_bytes(path)
        if b"\x00" in raw[:_SNIFF_BYTES]:
            raise DocumentError("binary")
        try:
            source = raw.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise DocumentError("not UTF-8") from None
        title, text = {"text": _plain, "markdown": markdown_text, "html": html_text}[kind](source)
    text = _tidy(text)
    if not text:
        raise DocumentError("empty")
    return " ".join(title.split()), text


def _files(root: Path) -> list[Path]:
    """Regular files under root sorted by their relative path, hidden files and folders (a leading ".") left out."""
    found = []
    for folder, subfolders, names in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")]
        found += [Path(folder) / name for name in names if not name.startswith(".")]
    return sorted((path for path in found if path.is_file()), key=lambda path: path.relative_to(root).as_posix())


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        raise DocumentError("unreadable") from None


def _plain(source: str) -> tuple[str, str]:
    return "", source


def _tidy(text: str) -> str:
    """Runs of spaces and tabs to one space, blank-line runs to one blank line, ends stripped."""
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


_FRONT_MATTER = re.compile(r"\A---\n.*?\n---\n", re.S)
_FENCE = re.compile(r"^\s*(```|~~~)")
_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
# Lines that are markup only: horizontal rules, table rules, reference-link definitions.
_MARKUP_LINE = re.compile(
    r"^\s*([-*_])(\s*\1){2,}\s*$|^\s*\|?\s*:?-{3,}:?\s*(\|\s*:?-{3,}:?\s*)*\|?\s*$|^\s{0,3}\[[^\]]+\]:\s+\S+.*$"
)
# Inline markup -> its text, in this order: quote and list marks, images (alt text), links (their text), reference
# links, autolinks, HTML tags, code spans, emphasis; table pipes become spaces.
_INLINE = (
    (re.compile(r"^\s*(?:>\s?)+|^\s*(?:[-*+]|\d+[.)])\s+(?:\[[ xX]\]\s+)?"), ""),
    (re.compile(r"!\[([^\]]*)\]\([^)]*\)"), r"\1"),
    (re.compile(r"\[([^\]]+)\]\([^)]*\)"), r"\1"),
    (re.compile(r"\[([^\]]+)\]\[[^\]]*\]"), r"\1"),
    (re.compile(r"<(https?://[^>]+)>"), r"\1"),
    (re.compile(r"</?[A-Za-z][^>]*>"), ""),
    (re.compile(r"`+([^`]*)`+"), r"\1"),
    (re.compile(r"(\*\*|\*|~~)(?=\S)(.+?)(?<=\S)\1"), r"\2"),
    (re.compile(r"(?<!\w)(__|_)(?=\S)(.+?)(?<=\S)\1(?!\w)"), r"\2"),  # not inside snake_case words
    (re.compile(r"\|"), " "),
)


def markdown_text(source: str) -> tuple[str, str]:
    """Markdown -> (its first heading, the text a reader sees after it). Code inside fences is kept as text, the
    fences dropped; table pipes become spaces."""
    source = _FRONT_MATTER.sub("", source.replace("\r\n", "\n"))
    title, lines, in_code = "", [], False
    for line in source.split("\n"):
        if _FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            lines.append(line)
            continue
        if _MARKUP_LINE.match(line):
            continue
        heading = _HEADING.match(line)
        if heading:
            line = heading.group(1)
        for pattern, replacement in _INLINE:
            line = pattern.sub(replacement, line)
        if heading and not title:  # the title heading: the block's title already, not its text
            title = line.strip()
            continue
        lines.append(line)
    return title, "\n".join(lines)


class _HtmlText(HTMLParser):
    """The <title> and the visible text of an HTML page: no tags, scripts, styles or templates; block elements end
    a line. Character references are converted by the parser."""

    SKIPPED = {"script", "style", "template", "noscript", "head"}
    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "pre", "td"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.title, self.parts, self.skipping, self.in_title = "", [], 0, False

    def handle_starttag(self, tag, attrs):
        if tag == "title":
            self.in_title = True
        elif tag in self.SKIPPED:
            self.skipping += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag == "title":
            self.in_title = False
        elif tag in self.SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if self.in_title:
            self.title += data
        elif not self.skipping:
            self.parts.append(data)


def html_text(source: str) -> tuple[str, str]:
    """HTML -> (its <title>, the visible text)."""
    parser = _HtmlText()
    parser.feed(source)
    parser.close()
    return parser.title, "".join(parser.parts)


def _read_pdf(path: Path) -> tuple[str, str]:
    try:
        from pypdf import PdfReader
        from pypdf.errors import PdfReadError
    except ImportError:
        raise DocumentError('PDF without pypdf (pip install "openrealm[pdf]")') from None
    try:
        reader = PdfReader(path)
        title = (reader.metadata.title if reader.metadata else None) or ""
        text = "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except (PdfReadError, OSError, ValueError, KeyError, TypeError):
        raise DocumentError("unreadable PDF") from None
    if not text.strip():
        raise DocumentError("PDF without a text layer")
    return str(title), text


__all__ = [
    "DOCUMENT_SUFFIXES",
    "DocumentFolder",
    "html_text",
    "is_document_folder",
    "markdown_text",
    "read_document",
    "read_document_folder",
]
