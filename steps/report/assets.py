"""The report's style and its one script (plain JS, no framework): written once into the site's assets.

The script draws every figure a page lists in its `figures` JSON element with plotly.js (loaded before it,
from the same folder), makes the rollout table sort and filter, and shows a screenshot's thumbnail at full size
over the page when it is clicked (a click or Escape closes it). It reads data only from JSON elements
(`JSON.parse`) and puts text into the page only as text (`textContent`), never as HTML.
"""

import json

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:1em 2em;color:#222}
h1{font-size:1.5em}h2{font-size:1.25em;border-bottom:1px solid #ddd;margin-top:2em}h3{font-size:1.05em}
table{border-collapse:collapse;margin:.5em 0;display:block;max-width:100%;overflow-x:auto}td,th{border:1px solid #ddd;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f4f4f4}th.sortable{cursor:pointer}td{font-variant-numeric:tabular-nums}
.plots{display:flex;flex-wrap:wrap;gap:8px}.plot{width:570px;height:330px}
pre{white-space:pre-wrap;word-break:break-word;background:#f8f8f8;border:1px solid #eee;padding:6px;margin:4px 0;max-height:30em;overflow:auto}
.note{color:#666}.turn{border-left:4px solid #ccc;padding-left:8px;margin:6px 0}
.warning{background:#fde2e1;border-left:4px solid #c33;padding:4px 8px}
.role-system{border-color:#999}.role-user{border-color:#3a7}.role-assistant{border-color:#37c}.role-tool{border-color:#c83}
.kind{font-weight:600;font-size:.9em}.call{border:1px solid #ddd;border-radius:4px;padding:6px 10px;margin:10px 0}
.tokens{font-family:ui-monospace,monospace;font-size:12px;line-height:1.9;white-space:pre-wrap;word-break:break-all}
.tokens span{border-radius:2px}.m0{background:#eee;color:#555}.m1{background:#dbeafe}.pr{color:#888}
.split{background:#fff3cd;padding:4px 8px;margin:4px 0}
#filter{width:20em}
.shots{display:flex;flex-wrap:wrap;gap:6px;margin:4px 0}.shot img{max-width:320px;max-height:240px;width:auto;height:auto;border:1px solid #ccc;cursor:zoom-in}
.overlay{position:fixed;inset:0;z-index:10;overflow:auto;background:rgba(0,0,0,.85);cursor:zoom-out}.overlay img{display:block;margin:20px auto;max-width:none;max-height:none}
"""

PAGE_ROWS = 200  # rollout table rows drawn at a time
NO_STATUS = "(none)"  # the status filter's value for a rollout without a status
# plotly.js's config for every plot: its toolbar without the selection tools (a line plot has nothing to select),
# so that the toolbar, upright at the plot's right edge (figures.py: `modebar`), stays clear of the title.
PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["select2d", "lasso2d"]}

JS = r"""
"use strict";
const PAGE_ROWS = %d, NO_STATUS = %s, PLOT_CONFIG = %s;
function readJson(id) {
  const el = document.getElementById(id);
  return el ? JSON.parse(el.textContent) : null;
}
function drawFigures() {
  const figures = readJson("figure-data") || [];
  for (const f of figures) {
    const div = document.getElementById(f.id);
    if (div) Plotly.newPlot(div, f.figure.data, f.figure.layout, PLOT_CONFIG);
  }
}
function screenshots() {
  const close = () => document.querySelectorAll(".overlay").forEach(o => o.remove());
  for (const link of document.querySelectorAll("a.shot")) {
    link.addEventListener("click", event => {
      event.preventDefault();
      close();
      const overlay = document.createElement("div"), full = document.createElement("img");
      overlay.className = "overlay"; full.src = link.href; full.alt = link.querySelector("img").alt;
      overlay.appendChild(full);
      overlay.addEventListener("click", close);
      document.body.appendChild(overlay);
    });
  }
  document.addEventListener("keydown", event => { if (event.key === "Escape") close(); });
}
function rolloutTable() {
  const data = readJson("rollout-data"), host = document.getElementById("rollout-table");
  if (!data || !host) return;
  let sortBy = null, ascending = true, first = 0;
  const filter = document.getElementById("filter"), status = document.getElementById("status-filter");
  const count = document.getElementById("rollout-count");
  const table = document.createElement("table"), head = table.createTHead().insertRow(), body = table.createTBody();
  data.columns.forEach((name, i) => {
    const th = document.createElement("th");
    th.textContent = name; th.className = "sortable";
    th.addEventListener("click", () => { ascending = sortBy === i ? !ascending : true; sortBy = i; first = 0; render(); });
    head.appendChild(th);
  });
  const pager = document.createElement("p"), back = document.createElement("button"), next = document.createElement("button");
  back.textContent = "previous " + PAGE_ROWS; next.textContent = "next " + PAGE_ROWS;
  back.addEventListener("click", () => { first = Math.max(0, first - PAGE_ROWS); render(); });
  next.addEventListener("click", () => { first += PAGE_ROWS; render(); });
  pager.append(back, " ", next);
  host.append(table, pager);
  function render() {
    const needle = filter.value.toLowerCase(), wanted = status.value;
    let rows = data.rows.filter(r => (!wanted || (r.cells[data.status] ?? NO_STATUS) === wanted) &&
      (!needle || r.cells.some(c => String(c ?? "").toLowerCase().includes(needle))));
    if (sortBy !== null) {
      rows = rows.slice().sort((a, b) => {
        const x = a.cells[sortBy], y = b.cells[sortBy];
        const order = (x === null) - (y === null) || (typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y)));
        return ascending ? order : -order;
      });
    }
    body.replaceChildren();
    if (first >= rows.length) first = Math.max(0, rows.length - PAGE_ROWS);
    for (const r of rows.slice(first, first + PAGE_ROWS)) {
      const tr = body.insertRow();
      r.cells.forEach((c, i) => {
        const td = tr.insertCell();
        if (i === data.link) { const a = document.createElement("a"); a.href = r.href; a.textContent = c; td.appendChild(a); }
        else td.textContent = typeof c === "number" && !Number.isInteger(c) ? c.toFixed(3) : (c ?? "");
      });
    }
    count.textContent = rows.length + " of " + data.rows.length + " rollouts" +
      (rows.length > PAGE_ROWS ? " (" + (first + 1) + "-" + Math.min(first + PAGE_ROWS, rows.length) + " shown)" : "");
    back.disabled = first === 0; next.disabled = first + PAGE_ROWS >= rows.length;
  }
  let typing = null;  // one render after typing pauses, not one per keystroke over every row
  filter.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(() => { first = 0; render(); }, 150); });
  status.addEventListener("change", () => { first = 0; render(); });
  render();
}
document.addEventListener("DOMContentLoaded", () => { drawFigures(); rolloutTable(); screenshots(); });
""" % (PAGE_ROWS, json.dumps(NO_STATUS), json.dumps(PLOT_CONFIG))
