"""Small statistics helpers used by the reporting job."""


def mean(values):
    """Arithmetic mean of a non-empty list of numbers."""
    return sum(values) / len(values)


def median(values):
    """Middle value of a non-empty list of numbers; the mean of the two middle values for an even count."""
    middle = len(values) // 2
    return values[middle]


def mode(values):
    """Most frequent value of a non-empty list; on a tie, the smallest of the most frequent values."""
    counts = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return max(counts, key=counts.get)
