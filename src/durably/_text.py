"""Text that a model, a tool or a caller wrote, made safe to show to a person.

The failure this prevents: such text reaches an operator raw. In a terminal,
an ESC sequence clears the screen, retitles the window, moves the cursor to
rewrite lines already printed or hides what follows; a bidi control
(U+202E) reorders what is shown, so `refund 10` can read as something else;
a lone CR overwrites the line. In the Temporal Web UI, which renders a run's
details as Markdown, a model's words can become links, images, headings or
HTML that look like durably's own.

Every such character is replaced by a visible escape (`\\x1b`, `\\u202e`), so
the operator sees that something was there, and for Markdown every ASCII
punctuation character is backslash-escaped. The functions are pure and
deterministic and import only the standard library: workflow code may call
them.
"""

from __future__ import annotations

import re

__all__ = ["md_code", "md_text", "printable"]

# C0 controls, DEL, C1 controls, the bidi controls (embeddings, overrides,
# isolates, marks) and lone surrogates, which no terminal can print.
_UNSAFE = [
    *range(0x00, 0x20),
    0x7F,
    *range(0x80, 0xA0),
    0x061C,
    0x200E,
    0x200F,
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
    *range(0xD800, 0xE000),
]
_NAMED = {0x09: "\\t", 0x0A: "\\n", 0x0D: "\\r"}


def _escape(code: int) -> str:
    if code in _NAMED:
        return _NAMED[code]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ESCAPES = {code: _escape(code) for code in _UNSAFE}
# Newlines and tabs pass through when the caller keeps them.
_ESCAPES_KEEPING = {c: e for c, e in _ESCAPES.items() if c not in (0x09, 0x0A)}
_FIND = re.compile("[" + "".join(re.escape(chr(c)) for c in _UNSAFE) + "]")
_FIND_KEEPING = re.compile(
    "[" + "".join(re.escape(chr(c)) for c in _UNSAFE if c not in (0x09, 0x0A)) + "]"
)
# In Markdown, every ASCII punctuation character may be backslash-escaped
# (CommonMark 2.4); escaping all of them also defeats GFM's bare-URL and
# e-mail autolinks, entities (`&`) and table pipes. An escape's own backslash
# is escaped too, so `\x1b` shows as typed.
_MD_ESCAPES = {
    **{c: e.replace("\\", "\\\\") for c, e in _ESCAPES.items()},
    **{ord(p): "\\" + p for p in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"},
}
_BACKTICKS = re.compile("`+")


def printable(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with every control, bidi control and lone surrogate shown as an escape.

    With `keep_newlines`, "\\n" and "\\t" stay (and "\\r\\n" becomes "\\n"):
    for multi-line text such as a model's answer. Otherwise they are
    escaped too, so the text stays on one line and cannot forge another.
    Text without such characters comes back unchanged (the same object).
    """
    if keep_newlines:
        if _FIND_KEEPING.search(text) is None:
            return text
        return text.replace("\r\n", "\n").translate(_ESCAPES_KEEPING)
    if _FIND.search(text) is None:
        return text
    return text.translate(_ESCAPES)


def md_text(text: str) -> str:
    """`text` as Markdown that renders as exactly these characters, inline.

    Controls become visible escapes (newlines too, so the text cannot start
    a block or end a paragraph), and ASCII punctuation is backslash-escaped,
    so no link, image, emphasis, heading, list, HTML tag, table or autolink
    can form. Leading spaces are kept: put the result inside a line, not at
    the start of a block.
    """
    return text.translate(_MD_ESCAPES)


def md_code(text: str) -> str:
    """`text` as one inline code span (shown verbatim, in a monospace font).

    Per CommonMark 6.1 the fence is a backtick run longer than any inside
    the text, and a space pads both ends when the text starts or ends with a
    backtick (or with spaces at both ends, which a renderer would strip).
    Controls, newlines included, become visible escapes. The span only
    holds if the surrounding Markdown has no unmatched backticks of its own.
    """
    text = printable(text)
    if not text:
        return "` `"
    fence = "`" * (max((len(run) for run in _BACKTICKS.findall(text)), default=0) + 1)
    padded = (
        text[0] == "`"
        or text[-1] == "`"
        or (text[0] == " " and text[-1] == " " and text.strip(" ") != "")
    )
    return f"{fence} {text} {fence}" if padded else f"{fence}{text}{fence}"
