"""Tests for /workspace/report.py and the /workspace/report.json it wrote.

The agent's files are read inside the tests, never at import time, so a missing or broken
script fails a test (reward 0) instead of breaking the test collection.
"""

import json
import subprocess
import sys
from pathlib import Path

WORKSPACE = Path("/workspace")
EXPECTED = {"orders": 25, "revenue": 2215.37, "top_product": "gizmo",
            "customers": ["acme", "globex", "hooli", "initech", "umbrella"]}
OTHER_ORDERS = """order_id,customer,product,quantity,unit_price
1,zeta,bolt,3,0.10
2,alpha,nut,1,0.05
3,zeta,nut,5,0.05
4,mid,bolt,1,0.10
"""


def read_report(path: Path) -> dict:
    report = json.loads(path.read_text())
    assert isinstance(report, dict), f"{path} must hold a JSON object"
    return report


def test_report_json_exists():
    assert (WORKSPACE / "report.json").is_file(), "/workspace/report.json was not written"


def test_report_json_values():
    report = read_report(WORKSPACE / "report.json")
    assert set(report) == set(EXPECTED), f"keys must be {sorted(EXPECTED)}, got {sorted(report)}"
    assert report["orders"] == EXPECTED["orders"]
    assert abs(report["revenue"] - EXPECTED["revenue"]) < 0.006
    assert report["top_product"] == EXPECTED["top_product"]
    assert report["customers"] == EXPECTED["customers"]


def test_script_handles_other_orders(tmp_path):
    orders = tmp_path / "orders.csv"
    orders.write_text(OTHER_ORDERS)
    output = tmp_path / "report.json"
    run = subprocess.run([sys.executable, str(WORKSPACE / "report.py"), str(orders), str(output)],
                         capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert run.returncode == 0, f"report.py failed: {run.stderr[-500:]}"
    report = read_report(output)
    assert report["orders"] == 4
    assert abs(report["revenue"] - 0.7) < 0.006
    assert report["top_product"] == "nut"
    assert report["customers"] == ["alpha", "mid", "zeta"]
