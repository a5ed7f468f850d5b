"""Tests for /app/wordfreq.py's top_words: case-insensitive counts, ties in alphabetical order.

The agent's module runs only in a child process (`python3 -I`), never inside pytest: code that is
imported here could end pytest with exit code 0 (`os._exit(0)`) or rewrite its reports, and so
pass every test. A broken file fails the tests (reward 0) instead.
"""

import json
import subprocess
import sys

MODULE = "/app/wordfreq.py"
# Loads the module from its file and prints top_words(text, n) as JSON.
CALL = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("wordfreq", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
print(json.dumps(module.top_words(sys.argv[2], int(sys.argv[3]))))
"""


def top_words(text: str, n: int) -> list:
    run = subprocess.run([sys.executable, "-I", "-c", CALL, MODULE, text, str(n)], capture_output=True, text=True,
                         timeout=30)
    assert run.returncode == 0, f"top_words failed: {run.stderr[-500:]}"
    return [tuple(pair) for pair in json.loads(run.stdout.splitlines()[-1])]


def test_counts_ignore_case():
    assert top_words("The cat. the CAT! The end.", 2) == [("the", 3), ("cat", 2)]


def test_ties_are_alphabetical():
    assert top_words("pear fig apple fig pear apple kiwi", 3) == [("apple", 2), ("fig", 2), ("pear", 2)]


def test_apostrophes_stay_inside_words():
    assert top_words("Don't stop. DON'T stop, don't", 2) == [("don't", 3), ("stop", 2)]


def test_cli_prints_counts(tmp_path):
    text = tmp_path / "text.txt"
    text.write_text("b a B c A b\n")
    run = subprocess.run([sys.executable, "-I", MODULE, str(text), "2"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0, run.stderr[-500:]
    assert run.stdout.splitlines() == ["3 b", "2 a"]
