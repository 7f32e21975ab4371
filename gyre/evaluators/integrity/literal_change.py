"""How a value mutant changes a literal (`mutants`): which literals qualify, which scalar in one changes, and
its new text, of the same kind and look as the old (an int by 2 to 9 keeping its sign, base, letter case and digit
grouping, a float by 2 to 20 % in its own notation and number of digits, a string's two different words trading
places in its own source, or with one word, one letter or digit for another of its class, so its prefix, quotes
and escapes stay): a literal spelled as no mutant is
spelled would tell the original (red-team 6: `1_000_000`, `u"..."`, `r"..."`, `0.142857`)."""

from __future__ import annotations

import ast
import random
import re
import string
from types import SimpleNamespace

INT_STEPS = range(2, 10)
"""An int literal moves by one of these (never 1: an off-by-one honest answer must not pass a mutant)."""
FLOAT_SCALE = (0.02, 0.2)
"""A float literal moves by this relative range (well outside pytest.approx's 1e-6 and assertAlmostEqual's 7
places)."""


def is_literal(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return isinstance(node.operand, ast.Constant)
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return all(is_literal(e) for e in node.elts)
    if isinstance(node, ast.Dict):
        return all(k is not None and is_literal(k) for k in node.keys) and all(is_literal(v) for v in node.values)
    return False


def scalar(literal: ast.expr, rng: random.Random) -> ast.Constant | ast.UnaryOp | None:
    """One changeable scalar inside `literal` (an int, float, str or bytes on one line, never a bool), at random."""
    found = []
    stack = [literal]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Dict):
            stack.extend(node.values)  # keys stay: a changed key reads as a different structure
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            stack.extend(node.elts)
        elif changeable(node):
            found.append(node)
    return rng.choice(found) if found else None


def changeable(node: ast.expr) -> bool:
    value = node.operand if isinstance(node, ast.UnaryOp) else node
    if not isinstance(value, ast.Constant) or node.lineno != node.end_lineno:
        return False
    v = value.value
    if isinstance(v, bool) or not isinstance(v, (int, float, str, bytes)):
        return False
    return not (isinstance(v, float) and v != v) and not (isinstance(v, (str, bytes)) and not has_alnum(v))


def has_alnum(v: str | bytes) -> bool:
    text = v.decode("latin-1") if isinstance(v, bytes) else v
    return any(c in string.ascii_letters + string.digits for c in text)


def span(node: ast.AST) -> tuple[tuple[int, int], tuple[int, int]]:
    return (node.lineno, node.col_offset), (node.end_lineno, node.end_col_offset)


def source(node: ast.AST, lines: list[str]) -> str:
    """`node`'s own source text (its span in `lines`, UTF-8 byte columns)."""
    if node.lineno == node.end_lineno:
        return lines[node.lineno - 1].encode("utf-8")[node.col_offset:node.end_col_offset].decode("utf-8")
    first = lines[node.lineno - 1].encode("utf-8")[node.col_offset:].decode("utf-8")
    middle = lines[node.lineno:node.end_lineno - 1]
    last = lines[node.end_lineno - 1].encode("utf-8")[:node.end_col_offset].decode("utf-8")
    return first + "".join(middle) + last


def text_at(start: tuple[int, int], end: tuple[int, int], lines: list[str]) -> str:
    """The source text from `start` to `end` ((line, UTF-8 byte column) pairs, as `span` gives them)."""
    return source(SimpleNamespace(lineno=start[0], col_offset=start[1], end_lineno=end[0], end_col_offset=end[1]),
                  lines)


def spelled(node: ast.expr) -> object:
    """The value the scalar literal `node` spells (`-3` for `- 3`)."""
    if isinstance(node, ast.UnaryOp):
        return -node.operand.value if isinstance(node.op, ast.USub) else node.operand.value
    return node.value


def changed(node: ast.expr, lines: list[str], rng: random.Random) -> str:
    """The replacement text of the scalar literal `node`: same kind, same look, another value."""
    token = source(node, lines)
    value = spelled(node)
    if isinstance(value, int):
        step = rng.choice(INT_STEPS)
        moved = rng.choice([v for v in (value + step, value - step) if (v >= 0) == (value >= 0)])  # sign kept
        return int_text(moved, token.lstrip("-+ "))
    if isinstance(value, float):
        scale = rng.uniform(*FLOAT_SCALE) * rng.choice((-1, 1))
        moved = value * (1 + scale) if value else scale
        return float_text(moved, value, token)
    return string_text(value, token, rng)


def int_text(value: int, like: str) -> str:
    """`value` written as `like` is: its base and letter case, its digit grouping (`1_000_000`)."""
    prefix = like[:2].lower()
    grouped = "_" in like
    if prefix in ("0x", "0o", "0b") and value >= 0:
        text = format(value, ("_" if grouped else "") + {"0x": "x", "0o": "o", "0b": "b"}[prefix])
        return like[:2] + (text.upper() if like[2:].isupper() else text)
    return format(value, "_" if grouped else "")


def float_text(moved: float, original: float, token: str) -> str:
    """`moved` written as `token` is (fixed or exponent notation, its letter case, its digits after the point when
    they keep it nearer to `moved` than to `original`, else as few as do)."""
    style = "e" if "e" in token.lower() else "f"
    mantissa, _, exponent = token.lower().lstrip("+- ").partition("e")
    places = len(mantissa.partition(".")[2])
    tried = ([places] if places or style == "e" else []) + list(range(1, 17))
    for p in tried:
        text = f"{moved:.{p}{style}}"
        if style == "e":
            m, _, e = text.partition("e")
            sign = "-" if e.startswith("-") else "+" if exponent.startswith("+") else ""
            text = f"{m}{'E' if 'E' in token else 'e'}{sign}{int(e.lstrip('+-'))}"
        if mantissa.startswith(".") and text.startswith(("0.", "-0.")):
            text = text.replace("0.", ".", 1)
        if abs(float(text) - moved) < abs(float(text) - original):
            return text
    return repr(moved)


def _swap(text: str, places: list[int], rng: random.Random) -> str:
    """`text` with the character at one of `places` (a letter or digit) replaced by another of its class."""
    i = rng.choice(places)
    pool = next(p for p in (string.ascii_lowercase, string.ascii_uppercase, string.digits) if text[i] in p)
    return text[:i] + rng.choice([c for c in pool if c != text[i]]) + text[i + 1:]


def _move_words(token: str, places: list[int], rng: random.Random) -> str | None:
    """`token` with two of its words (runs of `places`: letters and digits standing for themselves) trading places,
    two that differ, at random; None when it has no two different words. A real expected string is made of the
    words its test's input holds (`shout("hello world") == "HELLO WORLD!"`): a changed letter makes a word no input
    holds, which a forger checking each word against the call's arguments tells from a real one (red-team 6); words
    moved keep every word real."""
    runs: list[list[int]] = []
    for i in places:
        if runs and runs[-1][-1] == i - 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    words = [(r[0], r[-1] + 1) for r in runs]
    pairs = [(a, b) for n, a in enumerate(words) for b in words[n + 1:] if token[a[0]:a[1]] != token[b[0]:b[1]]]
    if not pairs:
        return None
    (a0, a1), (b0, b1) = rng.choice(pairs)
    return token[:a0] + token[b0:b1] + token[a1:b0] + token[a0:a1] + token[b1:]


_ESCAPE = re.compile(r"\\(x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|N\{[^}]*\}|[0-7]{1,3}|.)", re.DOTALL)


def _plain_alnum(token: str) -> list[int]:
    """Positions in a string literal's source `token` of the letters and digits that stand for themselves: inside
    its quotes, not part of an escape sequence (in a raw literal every character stands for itself)."""
    prefix = len(token) - len(token.lstrip("rRbBuUfF"))
    quote = 3 if token[prefix:prefix + 3] in ('"""', "'''") else 1
    start, end = prefix + quote, len(token) - quote
    escaped: set[int] = set()
    if "r" not in token[:prefix].lower():
        for m in _ESCAPE.finditer(token, start, end):
            escaped.update(range(m.start(), m.end()))
    return [i for i in range(start, end) if i not in escaped and token[i] in string.ascii_letters + string.digits]


def string_text(value: str | bytes, token: str, rng: random.Random) -> str:
    """`token` (the literal's own source: its prefix, quotes and escapes) with two different words trading places
    (`_move_words`), or, with fewer, one of its letters or digits replaced by another of its class: a mutant
    spelled as its original is. A literal whose source holds no such character outside its escapes is written
    from its value (`repr`, the same quotes)."""
    places = _plain_alnum(token)
    if places:
        written = _move_words(token, places, rng) or _swap(token, places, rng)
        if ast.literal_eval(written) != value:
            return written
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = _swap(text, [i for i, c in enumerate(text) if c in string.ascii_letters + string.digits], rng)
    changed = text.encode("latin-1") if isinstance(value, bytes) else text
    quote = next((c for c in token.lstrip("rRbBuUfF") if c in "'\""), "'")
    written = repr(changed)
    if quote == '"' and "'" not in text and '"' not in text:
        written = written.replace("'", '"')
    return written
