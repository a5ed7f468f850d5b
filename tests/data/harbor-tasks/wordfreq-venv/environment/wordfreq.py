"""Word frequencies of a text: `top_words(text, n)` and a small CLI (python wordfreq.py FILE [N])."""

import re
import sys
from collections import Counter

WORD = re.compile(r"[a-z]+(?:'[a-z]+)?")


def words(text: str) -> list[str]:
    """The words of `text`, lower-cased; an apostrophe inside a word keeps it whole (don't, it's)."""
    return WORD.findall(text)


def top_words(text: str, n: int = 3) -> list[tuple[str, int]]:
    """The `n` most frequent words with their counts, most frequent first; ties in alphabetical order."""
    counts = Counter(words(text))
    ranked = sorted(counts.items(), key=lambda item: item[1], reverse=True)
    return ranked[:n]


if __name__ == "__main__":
    limit = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    with open(sys.argv[1]) as source:
        for word, count in top_words(source.read(), limit):
            print(f"{count} {word}")
