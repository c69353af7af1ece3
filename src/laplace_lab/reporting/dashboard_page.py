"""The HTML of a sweep's dashboard (``laplace_lab.reporting.dashboard`` fills it in): one page with
its CSS and JavaScript inline and its figures as ``data:`` URIs, so it opens from the file system
with no server, no CDN and no request of any kind.

``render(page)`` takes a ``Page``: the header lines, the swept keys with their values (one
``<select>`` each), the verdicts section, and one ``Card`` per run (its swept values, figures and
metrics). Every run's card and its row of the metrics table carry ``data-run`` (its swept values as
JSON); the script shows only those whose values match every select. The selection is kept in the
address (``dashboard.html#seed=1&data.kind=moons``: a link to it opens it so). When the page has loaded, the
script marks each figure ``data-rendered="yes"`` (decoded, non-zero size) or ``"no"`` (then a
visible note says it could not be shown).
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass, field


@dataclass
class Figure:
    """One figure of a run: its name (``figures/<name>.png``), a caption, and either the PNG as a
    ``data:`` URI or the reason it is not shown."""

    name: str
    caption: str
    uri: str = ""
    missing: str = ""


@dataclass
class Card:
    """One run: its folder (relative to the sweep), swept values, figures, headline metrics (shown
    in the card and the side-by-side table) and every metric it logged."""

    job: str
    values: dict[str, str]
    figures: list[Figure]
    headline: dict[str, float]
    metrics: dict[str, float]


@dataclass
class Page:
    """Everything the page shows; ``verdicts`` is a list of rows (dicts with the ``VERDICT_COLUMNS``)
    or None, with ``verdict_note`` saying where they come from and how they were decided, or why
    there are none."""

    title: str
    header: list[tuple[str, str]]
    swept: dict[str, list[str]]
    cards: list[Card]
    headline_names: list[str]
    verdicts: list[dict[str, str]] | None
    verdict_note: str
    problems: list[str] = field(default_factory=list)


VERDICT_COLUMNS = ("metric", "reference", "ours", "verdict", "source")

STYLE = """body{font-family:system-ui,sans-serif;font-size:13px;margin:16px;color:#222}
h1{font-size:20px;margin:0 0 8px}h2{font-size:16px;margin:20px 0 8px}
dl.head{display:grid;grid-template-columns:max-content 1fr;gap:2px 12px;margin:0}
dl.head dt{font-weight:600}dl.head dd{margin:0;word-break:break-all}
#filters{position:sticky;top:0;background:#f4f6f8;border:1px solid #ccd;padding:8px;margin:12px 0;z-index:1}
#filters label{margin-right:14px;white-space:nowrap}#count{font-weight:600;margin-left:8px}
table{border-collapse:collapse;margin:4px 0}th,td{border:1px solid #ccd;padding:2px 6px;text-align:left;vertical-align:top}
th{background:#eef1f4}td.num{text-align:right;font-variant-numeric:tabular-nums}
#runs{display:grid;grid-template-columns:repeat(auto-fill,minmax(520px,1fr));gap:14px}
.run{border:1px solid #bbc;border-radius:4px;padding:8px}
.run h3{font-size:14px;margin:0 0 2px}.job{color:#666;font-size:11px;word-break:break-all;margin-bottom:6px}
figure{margin:4px 0 8px}figure img{max-width:100%;height:auto;display:block}
figcaption{color:#444;font-size:12px}.missing{color:#a40;font-style:italic}
.verdict{font-weight:600}[hidden]{display:none!important}"""

SCRIPT = """const selects = [...document.querySelectorAll('#filters select')];
const items = [...document.querySelectorAll('[data-run]')];
const count = document.getElementById('count');
function apply() {
  const want = selects.map(s => [s.dataset.key, s.value]);
  let shown = 0, total = 0;
  for (const el of items) {
    const values = JSON.parse(el.dataset.run);
    el.hidden = !want.every(([k, v]) => v === '' || values[k] === v);
    if (el.classList.contains('run')) { total += 1; if (!el.hidden) shown += 1; }
  }
  count.textContent = shown + ' of ' + total + ' runs shown';
  const chosen = want.filter(([k, v]) => v !== '');
  history.replaceState(null, '', chosen.length ? '#' + new URLSearchParams(chosen) : location.pathname);
}
const asked = new URLSearchParams(location.hash.slice(1));
for (const s of selects) {
  if ([...s.options].some(o => o.value === asked.get(s.dataset.key))) s.value = asked.get(s.dataset.key);
  s.addEventListener('change', apply);
}
apply();
window.addEventListener('load', () => {
  for (const img of document.querySelectorAll('figure img')) {
    const ok = img.complete && img.naturalWidth > 0 && img.naturalHeight > 0;
    img.dataset.rendered = ok ? 'yes' : 'no';
    if (!ok) {
      const note = document.createElement('div');
      note.className = 'missing';
      note.textContent = 'this figure could not be decoded by the browser';
      img.after(note);
    }
  }
});"""


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def number(value: float) -> str:
    """A metric as shown: 4 significant digits (``nan`` / ``inf`` as written)."""
    return f"{value:.4g}"


def _figure(fig: Figure) -> str:
    if fig.missing:
        return f'<figure><figcaption>{_e(fig.caption)}</figcaption><div class="missing">{_e(fig.missing)}</div></figure>'
    return (f'<figure><img src="{fig.uri}" alt="{_e(fig.caption)}" data-figure="{_e(fig.name)}">'
            f"<figcaption>{_e(fig.caption)}</figcaption></figure>")


def _metrics_table(metrics: dict[str, float]) -> str:
    rows = "".join(f'<tr><td>{_e(k)}</td><td class="num">{_e(number(v))}</td></tr>' for k, v in metrics.items())
    return f"<table><tr><th>metric</th><th>value</th></tr>{rows}</table>"


def _card(card: Card, swept: list[str]) -> str:
    title = ", ".join(f"{k}={card.values[k]}" for k in swept) or "the sweep's only run"
    head = _metrics_table(card.headline) if card.headline else '<div class="missing">no headline metrics</div>'
    return (f"<section class=\"run\" data-run='{_e(json.dumps(card.values))}'><h3>{_e(title)}</h3>"
            f'<div class="job">{_e(card.job)}</div>{"".join(_figure(f) for f in card.figures)}{head}'
            f"<details><summary>all {len(card.metrics)} metrics</summary>{_metrics_table(card.metrics)}</details>"
            "</section>")


def _side_by_side(page: Page) -> str:
    swept = list(page.swept)
    head = "".join(f"<th>{_e(k)}</th>" for k in [*swept, *page.headline_names])
    rows = []
    for card in page.cards:
        cells = "".join(f"<td>{_e(card.values[k])}</td>" for k in swept)
        cells += "".join(f'<td class="num">{_e(number(card.headline[m])) if m in card.headline else "-"}</td>'
                         for m in page.headline_names)
        rows.append(f"<tr data-run='{_e(json.dumps(card.values))}'>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(rows)}</table>"


def _filters(page: Page) -> str:
    if not page.swept:
        return '<div id="filters">no swept key to filter by<span id="count"></span></div>'
    selects = []
    for key, values in page.swept.items():
        options = '<option value="">all</option>' + "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)
        selects.append(f'<label>{_e(key)} <select data-key="{_e(key)}">{options}</select></label>')
    return f'<div id="filters">{"".join(selects)}<span id="count"></span></div>'


def _verdicts(page: Page) -> str:
    note = f"<p>{_e(page.verdict_note)}</p>"
    if not page.verdicts:
        return note
    head = "".join(f"<th>{c}</th>" for c in VERDICT_COLUMNS)
    rows = "".join("<tr>" + "".join(f'<td class="{c}">{_e(v[c])}</td>' for c in VERDICT_COLUMNS) + "</tr>"
                   for v in page.verdicts)
    return f"{note}<table><tr>{head}</tr>{rows}</table>"


def render(page: Page) -> str:
    """The page as one HTML document (no external reference: every figure is a ``data:`` URI)."""
    header = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in page.header)
    problems = ("<h2>Jobs not shown</h2><ul>" + "".join(f"<li>{_e(p)}</li>" for p in page.problems) + "</ul>"
                if page.problems else "")
    runs = "".join(_card(c, list(page.swept)) for c in page.cards) or "<p>No finished run in this launch.</p>"
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(page.title)}</title>'
            f"<style>{STYLE}</style></head><body><h1>{_e(page.title)}</h1><dl class=\"head\">{header}</dl>"
            f"{_filters(page)}<h2>Verdicts</h2>{_verdicts(page)}<h2>Metrics side by side</h2>{_side_by_side(page)}"
            f'{problems}<h2>Runs</h2><div id="runs">{runs}</div><script>{SCRIPT}</script></body></html>\n')
