import unittest

from stats import mean, median, mode


class StatsTest(unittest.TestCase):
    def test_mean(self):
        self.assertEqual(mean([1, 2, 3, 4]), 2.5)

    def test_median_odd(self):
        self.assertEqual(median([1, 2, 3]), 2)

    def test_median_even(self):
        self.assertEqual(median([1, 2, 3, 4]), 2.5)

    def test_median_unsorted(self):
        self.assertEqual(median([9, 1, 5]), 5)

    def test_mode_tie_takes_smallest(self):
        self.assertEqual(mode([3, 3, 1, 1, 2]), 1)


if __name__ == "__main__":
    unittest.main()
