"""PLD context matcher: n-gram prompt lookup over prompt + generated tokens.

Source: Goose paper, Appendix B.2 (CONTEXTMATCH, called at line 5 of Algorithm 2) and §4.3 (the
consensus flag); PLD itself is Saxena (2023).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class PldMatch:
    """Result of one context-match query.

    Attributes:
        draft: continuation token ids copied from the context (the spine candidates), possibly empty.
        n: n-gram length that produced ``draft`` (0 when there is no match).
        consensus: True iff at least two n-gram lengths return continuations that agree on the first token.
    """

    draft: tuple[int, ...] = ()
    n: int = 0
    consensus: bool = False


class NgramIndex:
    """Incremental index ``n-gram -> end positions`` for every n in ``ngram_sizes``.

    ``extend`` indexes only the newly appended tokens, so a query never rescans the sequence.
    The index owns its copy of the token sequence (prompt + generated).
    """

    def __init__(self, ngram_sizes: tuple[int, ...] = (5, 4, 3)) -> None:
        self.ngram_sizes = tuple(sorted(ngram_sizes, reverse=True))
        self.tokens: list[int] = []
        self._positions: dict[int, dict[tuple[int, ...], list[int]]] = {n: defaultdict(list) for n in self.ngram_sizes}

    def extend(self, new_tokens: list[int]) -> None:
        """Append tokens and index every n-gram that ends at one of them. O(len(new_tokens) * |ngram_sizes|)."""
        start = len(self.tokens)
        self.tokens.extend(int(t) for t in new_tokens)
        for end in range(start, len(self.tokens)):
            for n in self.ngram_sizes:
                if end + 1 >= n:
                    self._positions[n][tuple(self.tokens[end + 1 - n : end + 1])].append(end)

    def match(self, max_len: int) -> PldMatch:
        """Look up the sequence's last n tokens, longest n first.

        For each n, the most recent earlier occurrence of the suffix n-gram supplies up to ``max_len``
        continuation tokens.  The draft comes from the longest n that matches; the consensus flag is
        set when two or more n agree on the first continuation token (Appendix B.2).
        """
        last = len(self.tokens) - 1
        draft: tuple[int, ...] = ()
        best_n = 0
        first_tokens: list[int] = []
        for n in self.ngram_sizes:
            if last + 1 < n:
                continue
            ends = self._positions[n].get(tuple(self.tokens[last + 1 - n :]))
            if not ends:
                continue
            # most recent occurrence strictly before the current suffix (which is itself indexed)
            end = ends[-1] if ends[-1] < last else (ends[-2] if len(ends) > 1 else None)
            if end is None:
                continue
            cont = tuple(self.tokens[end + 1 : end + 1 + max_len])
            if not cont:
                continue
            first_tokens.append(cont[0])
            if not draft:
                draft, best_n = cont, n
        consensus = bool(draft) and first_tokens.count(draft[0]) >= 2
        return PldMatch(draft=draft, n=best_n, consensus=consensus)
