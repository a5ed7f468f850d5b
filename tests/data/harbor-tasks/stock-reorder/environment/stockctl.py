"""stockctl: a small inventory tool over the SQLite database /opt/stockctl/stock.db.

    stockctl list          every item: sku, name, on_hand, reorder_level (tab-separated, with a header)
    stockctl show SKU      one item, one field per line
"""

import sqlite3
import sys

DATABASE = "/opt/stockctl/stock.db"
COLUMNS = ("sku", "name", "on_hand", "reorder_level")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("list", "show") or (argv[0] == "show") != (len(argv) == 2):
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with sqlite3.connect(f"file:{DATABASE}?mode=ro", uri=True) as db:
        if argv[0] == "list":
            print("\t".join(COLUMNS))
            for row in db.execute("SELECT sku, name, on_hand, reorder_level FROM items ORDER BY sku"):
                print("\t".join(str(value) for value in row))
            return 0
        row = db.execute("SELECT sku, name, on_hand, reorder_level FROM items WHERE sku = ?", (argv[1],)).fetchone()
    if row is None:
        print(f"stockctl: no item {argv[1]}", file=sys.stderr)
        return 1
    for column, value in zip(COLUMNS, row):
        print(f"{column}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
