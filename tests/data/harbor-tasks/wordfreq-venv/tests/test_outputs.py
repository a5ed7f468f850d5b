"""Tests for /app/wordfreq.py's top_words: case-insensitive counts, ties in alphabetical order.

The module is loaded inside each test, never at import time, so a broken file fails the tests
(reward 0) instead of breaking the test collection.
"""

import importlib.util
import subprocess
import sys

MODULE = "/app/wordfreq.py"


def load_wordfreq():
    spec = importlib.util.spec_from_file_location("wordfreq", MODULE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_counts_ignore_case():
    wordfreq = load_wordfreq()
    assert wordfreq.top_words("The cat. the CAT! The end.", 2) == [("the", 3), ("cat", 2)]


def test_ties_are_alphabetical():
    wordfreq = load_wordfreq()
    assert wordfreq.top_words("pear fig apple fig pear apple kiwi", 3) == [("apple", 2), ("fig", 2), ("pear", 2)]


def test_apostrophes_stay_inside_words():
    wordfreq = load_wordfreq()
    assert wordfreq.top_words("Don't stop. DON'T stop, don't", 2) == [("don't", 3), ("stop", 2)]


def test_cli_prints_counts(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("b a B c A b\n")
    run = subprocess.run([sys.executable, MODULE, str(text), "2"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout.splitlines() == ["3 b", "2 a"]
