"""Hidden tests of /app/stats.py: more inputs than the visible tests, and no mutation of the input."""

import unittest

from stats import mean, median, mode


class HiddenStatsTest(unittest.TestCase):
    def test_median_single(self):
        self.assertEqual(median([7]), 7)

    def test_median_even_unsorted_negative(self):
        self.assertEqual(median([10, -4, 3, 0]), 1.5)

    def test_median_floats(self):
        self.assertAlmostEqual(median([0.5, 0.25, 0.75]), 0.5)

    def test_median_keeps_input(self):
        values = [5, 3, 9, 1]
        median(values)
        self.assertEqual(values, [5, 3, 9, 1])

    def test_mode_tie_negative(self):
        self.assertEqual(mode([2, -1, 2, -1, 5]), -1)

    def test_mode_single_winner(self):
        self.assertEqual(mode([4, 4, 4, 1, 1, 9]), 4)

    def test_mean_floats(self):
        self.assertAlmostEqual(mean([0.1, 0.2, 0.3]), 0.2)


if __name__ == "__main__":
    unittest.main()
