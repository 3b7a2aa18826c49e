"""Words in what users read: the one place a count and its noun agree ("1 region", "2 regions"), and
the first line of a message (an exception's, a tool's output) where one line is shown."""
from __future__ import annotations

_SIBILANT = ("s", "x", "z", "ch", "sh")


def plural(n: int, word: str, many: str | None = None) -> str:
    """`n word`, the noun in its plural for any n but 1: "1 kernel", "0 kernels", "2 launches",
    "3 entries"; `many` gives an irregular plural ("1 matrix", "2 matrices")."""
    if n == 1:
        return f"{n} {word}"
    if many is None:
        if word.endswith(_SIBILANT):
            many = word + "es"
        elif len(word) > 1 and word.endswith("y") and word[-2] not in "aeiou":
            many = word[:-1] + "ies"
        else:
            many = word + "s"
    return f"{n} {many}"


def first_line(text) -> str:
    """The first line of a message, stripped ("" for none). A first line that only introduces what
    follows ("backend='inductor' raised:", torch.compile's wrapper of the real error) gets the next
    non-empty line after it, which says what went wrong."""
    lines = [line.strip() for line in str(text or "").strip().splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def says_out_of_memory(text) -> bool:
    """Whether a message reports memory running out (torch's and CUDA's own words)."""
    return "out of memory" in str(text or "").lower()
