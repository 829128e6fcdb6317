"""The status page: a board's snapshot as one HTML page (Jinja2), with its plots inline (matplotlib SVG).

Live (``refresh_s`` > 0) it reloads itself every ``refresh_s`` seconds, keeping its ``?token=``; rendered from
a finished run's folder (``diloco status DIR``) it is the same page without the reload. Each learner's row has
``id="learner-<m>"`` and ``data-state`` / ``data-step`` / ``data-restarts`` attributes (what a test or a script reads).
"""

from __future__ import annotations

import datetime as _dt
import functools
import html
from typing import Any

from diloco.decoupled.status.plots import loss_svg, rate_svg

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
{% if refresh_s %}<meta http-equiv="refresh" content="{{ refresh_s }}">{% endif %}
<title>diloco run {{ s.name }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.2em 2em; color: #222; }
h1 { font-size: 1.3em; margin-bottom: 0.2em; } h2 { font-size: 1.05em; margin: 1.2em 0 0.4em; }
.sub { color: #666; font-size: 0.9em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { padding: 0.3em 0.7em; border-bottom: 1px solid #ddd; text-align: right; white-space: nowrap; }
th { background: #f3f4f8; } td.l, th.l { text-align: left; }
.state { font-weight: 600; border-radius: 0.3em; padding: 0.1em 0.5em; }
.live { background: #d7f5dd; color: #126b26; } .finished { background: #dde7fb; color: #1a3f8f; }
.lost, .left { background: #fbdcdc; color: #8f1a1a; } .not-joined, .stopped { background: #eee; color: #555; }
.active { background: #d7f5dd; color: #126b26; } .not-answering, .unknown { background: #fbdcdc; color: #8f1a1a; }
.plots { display: flex; flex-wrap: wrap; gap: 1.5em; } .plots figure { margin: 0; }
figcaption { font-size: 0.85em; color: #555; }
</style></head>
<body>
<h1>Decoupled DiLoCo run <code>{{ s.name }}</code></h1>
<div class="sub">{{ when }}{% if s.elapsed_s is not none %} &middot; {{ "%.0f"|format(s.elapsed_s) }} s since the first
event{% endif %}{% if s.finished %} &middot; every learner finished{% endif %}{% if refresh_s %} &middot; refreshes every
{{ refresh_s }} s{% endif %}</div>

<h2>Learners</h2>
<table id="learners">
<tr><th class="l">site</th><th class="l">host</th><th class="l">state</th><th>step</th><th>tokens</th>
<th>steps/s</th><th>waiting</th><th>staleness</th><th class="l">last merge counted in</th><th>guard events</th>
<th>restarts</th></tr>
{% for r in s.learners %}
<tr id="learner-{{ r.learner }}" data-state="{{ r.state }}" data-step="{{ r.step if r.step is not none else '' }}"
data-restarts="{{ r.restarts }}">
<td class="l">{{ r.site }}</td><td class="l">{{ r.host or "?" }}</td>
<td class="l"><span class="state {{ r.state|replace(' ', '-') }}">{{ r.state }}</span>{% if r.silent_s is not none
and r.state in ("lost", "left") %} <span class="sub">(silent {{ "%.0f"|format(r.silent_s) }} s)</span>{% endif %}</td>
<td>{{ r.step if r.step is not none else "-" }}</td><td>{{ tokens(r.tokens) }}</td>
<td>{{ num(r.step_rate, "%.2f") }}</td><td>{{ pct(r.waiting_share) }}</td>
<td>{{ r.staleness if r.staleness is not none else "-" }}</td>
<td class="l">{% if r.last_merge %}fragment {{ r.last_merge.fragment }} v{{ r.last_merge.version }}, {{
"%.0f"|format(r.last_merge_age_s) }} s ago{% else %}-{% endif %}</td>
<td>{{ r.guard_events }}{% if r.guard %} <span class="sub">({% for a, n in r.guard.items() %}{{ a }} {{ n }}{% if not
loop.last %}, {% endif %}{% endfor %})</span>{% endif %}</td>
<td>{{ r.restarts }}</td></tr>
{% endfor %}
</table>

<h2>Merges and the syncer</h2>
<table id="syncer">
<tr><th class="l">syncer</th><td class="l"><span class="state {{ s.syncer.state|replace(' ', '-') }}">{{ s.syncer.state
}}</span></td><th class="l">epoch</th><td>{{ s.syncer.epoch }} ({{ s.syncer.restarts }} restart{{ "" if
s.syncer.restarts == 1 else "s" }})</td><th class="l">checkpoint age</th><td>{{ num(s.syncer.checkpoint_age_s, "%.1f s")
}}</td><th class="l">pid</th><td>{{ s.syncer.pid or "-" }}</td></tr>
<tr><th class="l">merges</th><td>{{ s.merges.total }}</td><th class="l">per minute</th><td>{{ "%.0f"|format(
s.merges.per_minute) }}</td><th class="l">quorum sizes</th><td class="l">{% for k, n in s.merges.quorum_sizes.items()
%}{{ k }}: {{ n }}{% if not loop.last %}, {% endif %}{% else %}-{% endfor %}</td><th class="l">refused joins</th><td>{{
s.syncer.refused }}</td></tr>
</table>

<h2>Plots</h2>
<div class="plots">
<figure>{{ loss_plot|safe }}<figcaption>Loss of the global parameters against tokens{% if s.loss %} (latest {{
"%.4f"|format(s.loss[-1].loss) }}){% endif %}</figcaption></figure>
<figure>{{ rate_plot|safe }}<figcaption>Each learner's step rate</figcaption></figure>
</div>
</body></html>
"""


def _num(x: Any, fmt: str) -> str:
    return "-" if x is None else fmt % x


def _pct(x: Any) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _tokens(x: Any) -> str:
    if x is None:
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f}"


@functools.cache
def _template() -> Any:
    """The page's template, compiled once."""
    import jinja2

    return jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined).from_string(TEMPLATE)


def render(snapshot: dict[str, Any], *, refresh_s: int = 0, plots: tuple[str, str] | None = None) -> str:
    """The page of ``snapshot`` (:meth:`Board.snapshot`); ``plots``: the two SVGs, drawn already (else drawn here)."""
    loss_plot, rate_plot = plots if plots is not None else (loss_svg(snapshot), rate_svg(snapshot))
    when = _dt.datetime.fromtimestamp(snapshot["now"], tz=_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return _template().render(
        s=snapshot,
        refresh_s=int(refresh_s),
        when=html.escape(when),
        loss_plot=loss_plot,
        rate_plot=rate_plot,
        num=_num,
        pct=_pct,
        tokens=_tokens,
    )


__all__ = ["TEMPLATE", "render"]
