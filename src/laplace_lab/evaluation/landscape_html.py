"""``figures/landscape.html``: the 2-D landscape grids as a self-contained page (inline data and
a few lines of JavaScript drawing each grid on a canvas; no server, no library). Hovering a cell
shows its coordinates and every panel's value there."""

from __future__ import annotations

import html
import json
from pathlib import Path

import numpy as np

from laplace_lab.evaluation.landscape import Landscape
from laplace_lab.evaluation.landscape_plots import LOSS_LABEL, axis_label, laplace_name, suptitle

PAGE = """<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>loss landscape</title>
<style>body{font-family:sans-serif;font-size:13px;margin:16px}.row{display:flex;gap:18px;flex-wrap:wrap}
.panel{text-align:center}canvas{border:1px solid #999;image-rendering:pixelated;cursor:crosshair}
#info{margin:10px 0;min-height:2.6em;white-space:pre}</style></head><body>
<h3>__TITLE__</h3><p>__AXES__. Red dot: the MAP. Colours: each panel from its own minimum (dark) to maximum (light);
the difference from blue (negative) through white to red.</p><div id="info">hover a grid cell</div>
<div id="grids"></div>
<script>
const DATA = __DATA__;
const VIRIDIS = [[68,1,84],[59,82,139],[33,145,140],[94,201,98],[253,231,37]];
const DIVERGING = [[33,102,172],[247,247,247],[178,24,43]];
function color(stops, t) {
  t = Math.min(1, Math.max(0, t)) * (stops.length - 1);
  const i = Math.min(stops.length - 2, Math.floor(t)), f = t - i;
  return stops[i].map((c, k) => Math.round(c + f * (stops[i + 1][k] - c)));
}
const SIZE = 300, info = document.getElementById("info");
for (const grid of DATA) {
  const h = document.createElement("h4"); h.textContent = grid.title;
  const row = document.createElement("div"); row.className = "row";
  document.getElementById("grids").append(h, row);
  const n1 = grid.a1.length, n2 = grid.a2.length;
  for (const p of grid.panels) {
    const div = document.createElement("div"); div.className = "panel";
    const cv = document.createElement("canvas"); cv.width = n1; cv.height = n2;
    cv.style.width = SIZE + "px"; cv.style.height = SIZE + "px";
    const ctx = cv.getContext("2d"), img = ctx.createImageData(n1, n2);
    let lo = Infinity, hi = -Infinity;
    p.values.flat().forEach(v => { if (isFinite(v)) { lo = Math.min(lo, v); hi = Math.max(hi, v); } });
    if (p.diverging) { hi = Math.max(Math.abs(lo), Math.abs(hi)) || 1; lo = -hi; }
    for (let i = 0; i < n1; i++) for (let j = 0; j < n2; j++) {
      const c = color(p.diverging ? DIVERGING : VIRIDIS, (p.values[i][j] - lo) / ((hi - lo) || 1));
      const o = 4 * ((n2 - 1 - j) * n1 + i); img.data.set([...c, 255], o);
    }
    ctx.putImageData(img, 0, 0);
    const i0 = grid.a1.reduce((b, v, k) => Math.abs(v) < Math.abs(grid.a1[b]) ? k : b, 0);
    const j0 = grid.a2.reduce((b, v, k) => Math.abs(v) < Math.abs(grid.a2[b]) ? k : b, 0);
    ctx.fillStyle = "red"; ctx.fillRect(i0, n2 - 1 - j0, 1, 1);
    cv.onmousemove = e => {
      const r = cv.getBoundingClientRect();
      const i = Math.min(n1 - 1, Math.floor((e.clientX - r.left) / r.width * n1));
      const j = Math.min(n2 - 1, n2 - 1 - Math.floor((e.clientY - r.top) / r.height * n2));
      info.textContent = `a1 = ${grid.a1[i].toPrecision(4)}, a2 = ${grid.a2[j].toPrecision(4)}\\n` +
        grid.panels.map(q => `${q.name}: ${q.values[i][j].toPrecision(5)}`).join("   ");
    };
    const cap = document.createElement("div");
    cap.textContent = `${p.name} [${lo.toPrecision(3)}, ${hi.toPrecision(3)}]`;
    div.append(cv, cap); row.append(div);
  }
}
</script></body></html>
"""


def _panel(name: str, values: np.ndarray, diverging: bool = False) -> dict:
    return {"name": name, "values": np.round(values, 10).tolist(), "diverging": diverging}


def page(ls: Landscape, dataset: str | None = None) -> str:
    """The HTML text for ``ls``."""
    loss, post = ls.two_d, ls.post_two_d
    log_lik, log_gauss = -post.values["delta"], post.values["log_gauss"]
    lik, gauss = np.exp(log_lik - log_lik.max()), np.exp(log_gauss - log_gauss.max())  # as in the figures
    data = [
        {"title": "loss and test metric", "a1": loss.axes[0].tolist(), "a2": loss.axes[1].tolist(),
         "panels": [_panel(LOSS_LABEL, loss.values["loss"]), _panel(f"test {ls.metric_name}", loss.values["metric"])]},
        {"title": f"likelihood vs Gaussian ({ls.posterior_grid})", "a1": post.axes[0].tolist(),
         "a2": post.axes[1].tolist(),
         "panels": [_panel("exp(-(E - E_MAP)) / its max", lik), _panel(f"Gaussian / its max: {laplace_name(ls)}", gauss),
                    _panel("difference", lik - gauss, diverging=True), _panel("-(E - E_MAP)", log_lik),
                    _panel("log Gaussian", log_gauss)]},
    ]
    axes = f"horizontal: {axis_label(ls, 0)}; vertical: {axis_label(ls, 1)}"
    return (PAGE.replace("__TITLE__", html.escape(suptitle(ls, dataset)))
            .replace("__AXES__", html.escape(axes)).replace("__DATA__", json.dumps(data)))


def write(ls: Landscape, path: str | Path, dataset: str | None = None) -> Path:
    path = Path(path)
    path.write_text(page(ls, dataset))
    return path
