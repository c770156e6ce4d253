"""Subjects and the subject trie (NATS grammar). Pure: no sockets, no clocks.

Rule SJ1 - Grammar. A subject is ``.``-separated tokens (bytes), each non-empty and free of
  whitespace, at most ``MAX_SUBJECT`` bytes in all. A *pattern* is a subject whose tokens may
  also be ``*`` (exactly one token) or, as its last token only, ``>`` (one or more tokens).
  A published subject holds no wildcard token. A token that merely contains ``*`` or ``>``
  (``a*``) is an ordinary token, as in NATS.
Rule SJ2 - Matching. The trie walks a subject's tokens once, following the exact child, the
  ``*`` child and, when at least one token is left, the ``>`` child: the work per message
  grows with the subject's length and the wildcard branches it meets, never with the number
  of subscriptions on other subjects (no scan over subscriptions).
Rule SJ3 - Entries. The trie stores opaque entries per pattern (a dict keyed by the entry,
  so adding is idempotent); removing the last entry of a pattern prunes its empty nodes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

__all__ = [
    "MAX_SUBJECT",
    "SubjectError",
    "SubjectTrie",
    "check_pattern",
    "check_subject",
    "matches",
]

#: Longest subject or pattern, in bytes.
MAX_SUBJECT = 1024

_STAR = b"*"
_REST = b">"
_BAD = frozenset(b" \t\r\n\x00")

T = TypeVar("T")


class SubjectError(ValueError):
    """A subject or pattern that breaks Rule SJ1 (the message says how)."""


def _shown(name: bytes) -> str:
    """A subject or pattern as errors show it: its text, quoted (``'a.*'``, not ``b'a.*'``)."""
    return repr(name.decode("utf-8", "backslashreplace"))


def _tokens(text: bytes, what: str) -> list[bytes]:
    if not text:
        raise SubjectError(f"empty {what}")
    if len(text) > MAX_SUBJECT:
        raise SubjectError(f"{what} longer than {MAX_SUBJECT} bytes")
    if not _BAD.isdisjoint(text):
        raise SubjectError(f"{what} {_shown(text)} holds whitespace or NUL")
    tokens = text.split(b".")
    if b"" in tokens:
        raise SubjectError(f"{what} {_shown(text)} has an empty token")
    return tokens


def check_subject(subject: bytes) -> list[bytes]:
    """The tokens of a subject one may publish to (Rule SJ1), or :exc:`SubjectError`."""
    tokens = _tokens(subject, "subject")
    if _STAR in tokens or _REST in tokens:
        raise SubjectError(
            f"subject {_shown(subject)} holds a wildcard (publish to a plain subject)"
        )
    return tokens


def check_pattern(pattern: bytes) -> list[bytes]:
    """The tokens of a subscription pattern (Rule SJ1), or :exc:`SubjectError`."""
    tokens = _tokens(pattern, "pattern")
    if _REST in tokens[:-1]:
        raise SubjectError(f"pattern {_shown(pattern)}: '>' may only be the last token")
    return tokens


def matches(pattern: bytes, subject: bytes) -> bool:
    """Whether ``pattern`` matches ``subject`` (both valid; a plain, brute-force check)."""
    p = pattern.split(b".")
    s = subject.split(b".")
    for i, token in enumerate(p):
        if token == _REST:
            return len(s) > i
        if i >= len(s) or (token != _STAR and token != s[i]):
            return False
    return len(p) == len(s)


class _Node(Generic[T]):
    __slots__ = ("children", "entries", "parent", "token")

    def __init__(self, parent: _Node[T] | None, token: bytes) -> None:
        self.children: dict[bytes, _Node[T]] = {}
        self.entries: dict[T, None] = {}
        self.parent = parent
        self.token = token


class SubjectTrie(Generic[T]):
    """Patterns to entries; :meth:`match` finds the entries of every pattern matching a
    subject (Rules SJ2, SJ3)."""

    def __init__(self) -> None:
        self._root: _Node[T] = _Node(None, b"")
        self._patterns = 0

    def __len__(self) -> int:
        """Distinct patterns with at least one entry."""
        return self._patterns

    def add(self, tokens: list[bytes], entry: T) -> None:
        node = self._root
        for token in tokens:
            child = node.children.get(token)
            if child is None:
                child = node.children[token] = _Node(node, token)
            node = child
        if not node.entries:
            self._patterns += 1
        node.entries[entry] = None

    def remove(self, tokens: list[bytes], entry: T) -> bool:
        """Remove ``entry`` from ``tokens``' pattern; whether it was there."""
        node: _Node[T] | None = self._root
        for token in tokens:
            assert node is not None
            node = node.children.get(token)
            if node is None:
                return False
        assert node is not None
        if node.entries.pop(entry, 0) is None:
            if not node.entries:
                self._patterns -= 1
            while node.parent is not None and not node.entries and not node.children:
                del node.parent.children[node.token]
                node = node.parent
            return True
        return False

    def match(self, subject: list[bytes]) -> Iterator[T]:
        """The entries of every pattern matching ``subject``'s tokens (an entry stored
        under two matching patterns comes twice)."""
        last = len(subject)
        stack: list[tuple[_Node[T], int]] = [(self._root, 0)]
        while stack:
            node, i = stack.pop()
            children = node.children
            if i == last:
                yield from node.entries
                continue
            rest = children.get(_REST)
            if rest is not None:
                yield from rest.entries
            star = children.get(_STAR)
            if star is not None:
                stack.append((star, i + 1))
            exact = children.get(subject[i])
            if exact is not None:
                stack.append((exact, i + 1))
