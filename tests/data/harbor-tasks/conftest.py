"""The task folders here are data: their tests/test_outputs.py run inside a sandbox, never in this suite."""

collect_ignore_glob = ["*"]
