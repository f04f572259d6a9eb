"""HTML of the plugin's pages: Jinja2 templates with autoescaping, fed plain values (no I/O here).

Pages are plain server-rendered HTML with relative-to-root links, so they work inside the Airflow
UI's iframe and opened on their own. Every value that came from the lake or the user is escaped
by Jinja2's autoescape; URLs are built with :func:`urllib.parse.quote`/``urlencode``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import quote, urlencode

from jinja2 import ChainableUndefined, DictLoader, Environment, select_autoescape

from tidewater.ui import URL_PREFIX
from tidewater.ui import format as fmt
from tidewater.ui.reports import report_href

_LAYOUT = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }} · tidewater</title>
<style>
body { font-family: system-ui, sans-serif; margin: 0; color: #1f2933; background: #fff; }
header { display: flex; gap: 1.2em; align-items: baseline; padding: .7em 1.2em; border-bottom: 1px solid #d9e2ec; }
header strong { font-size: 1.1em; }
header a { color: #0b69a3; text-decoration: none; } header a.here { font-weight: 600; text-decoration: underline; }
header .ns { margin-left: auto; color: #52606d; font-size: .9em; }
main { padding: 1em 1.2em; }
table { border-collapse: collapse; font-size: .9em; }
th, td { border: 1px solid #d9e2ec; padding: .3em .6em; text-align: left; vertical-align: top; }
th { background: #f0f4f8; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ok { color: #05603a; font-weight: 600; } .failed { color: #b42318; font-weight: 600; } .muted { color: #7b8794; }
.warn { color: #b42318; font-weight: 600; }
.message { padding: .7em 1em; border-radius: 4px; margin: .8em 0; max-width: 70em; }
.message.refused, .message.error { background: #fef3f2; border: 1px solid #fda29b; color: #7a271a; }
.message.info { background: #f0f9ff; border: 1px solid #b9e6fe; }
textarea { width: 100%; max-width: 70em; font-family: ui-monospace, monospace; font-size: .95em; }
.pager { margin: .6em 0; display: flex; gap: 1em; align-items: baseline; }
code, pre { font-family: ui-monospace, monospace; }
section.stream { border-top: 1px solid #d9e2ec; padding-top: .4em; margin-bottom: 1.6em; }
.state { font-size: .7em; padding: .1em .5em; border-radius: 3px; margin-left: .5em; vertical-align: middle; }
.state-running { background: #d1fadf; color: #05603a; } .state-starting { background: #e0f2fe; color: #075985; }
.state-stalled, .state-dead, .state-failed { background: #fee4e2; color: #b42318; }
.state-stopped { background: #f0f4f8; color: #52606d; }
.charts { display: flex; flex-wrap: wrap; gap: .6em; margin: .6em 0; }
svg.chart { border: 1px solid #d9e2ec; background: #fff; }
form.actions { margin: .4em 0; } form.actions button { margin-right: .4em; }
</style></head>
<body>
<header><strong>tidewater</strong>
{% for key, label in nav %}<a href="{{ root }}/{{ key }}{{ ns_query }}" class="{{ 'here' if key == active else '' }}"
  id="nav-{{ key }}">{{ label }}</a>{% endfor %}
<span class="ns">namespace <code>{{ namespace }}</code></span></header>
<main>
<h1>{{ title }}</h1>
{% block content %}{% endblock %}
</main></body></html>
"""

_TABLES = """{% extends "layout" %}{% block content %}
<table id="tables"><thead><tr>
<th>Table</th><th>Version</th><th>Rows</th><th>Size</th><th>Files</th><th>Last commit</th><th>Latest audit</th>
</tr></thead><tbody>
{% for t in tables %}
<tr data-table="{{ t.name }}">
<td><a href="{{ root }}/tables/{{ t.name | urlpart }}/history{{ ns_query }}" class="history">{{ t.name }}</a></td>
{% if t.error or t.info.get("error") %}<td colspan="5" class="failed">{{ t.error or t.info.get("error") }}</td>
{% elif not t.info.get("exists", True) %}<td colspan="5" class="muted">not created yet</td>
{% else %}
<td class="num version">{{ t.info.get("version") }}</td>
<td class="num rows">{{ t.info.get("rows") }}</td>
<td class="num size">{{ t.info.get("size_bytes") | size }}</td>
<td class="num">{{ t.info.get("files", "") }}</td>
<td class="commit">{{ t.info.get("last_commit_time") | when }}<br>
<span class="muted">{{ t.info.get("last_operation") or "" }}
{% set run = t.info.get("last_commit_metadata") | run %}{% if run %} · {{ run }}{% endif %}</span></td>
{% endif %}
<td class="audit">{% if t.audit %}
<span class="audit-status {{ 'ok' if t.audit.success else 'failed' }}">
{{- "passed" if t.audit.success else "failed" }}</span>
{{ t.audit.suite }}<br><span class="muted">{{ t.audit.interval_start | interval(t.audit.interval_end) }}</span>
{% if t.audit.report_path %}<br><a class="report" href="{{ t.audit.report_path | report }}">report</a>{% endif %}
{% else %}<span class="muted">no audit</span>{% endif %}</td>
</tr>
{% else %}<tr><td colspan="7" class="muted">no tables in this namespace</td></tr>{% endfor %}
</tbody></table>
{% endblock %}"""

_HISTORY = """{% extends "layout" %}{% block content %}
<p><a href="{{ root }}/tables{{ ns_query }}">← all tables</a> ·
<a href="{{ root }}/sql?{{ example_query }}" id="query-this">query this table</a></p>
<table id="history"><thead><tr><th>Version</th><th>Time</th><th>Operation</th><th>Run</th><th>Metrics</th></tr></thead>
<tbody>{% for c in commits %}
<tr><td class="num">{{ c.get("version") }}</td><td>{{ c.get("timestamp") | when }}</td>
<td>{{ c.get("operation") or "" }}</td><td>{{ c | commit_run }}</td>
<td><code>{{ c.get("operationMetrics") | brief }}</code></td></tr>
{% else %}<tr><td colspan="5" class="muted">no commits</td></tr>{% endfor %}</tbody></table>
{% endblock %}"""

_SQL = """{% extends "layout" %}{% block content %}
<form method="get" action="{{ root }}/sql" id="sql-form">
{% if namespace_param %}<input type="hidden" name="namespace" value="{{ namespace_param }}">{% endif %}
<textarea name="sql" id="sql" rows="6" spellcheck="false"
 placeholder="SELECT * FROM rsvps.silver VERSION AS OF 3 LIMIT 20">{{ sql }}</textarea><br>
<label>rows per page <select name="page_size" id="page_size">
{% for n in sizes %}<option value="{{ n }}" {{ 'selected' if n == page_size else '' }}>{{ n }}</option>{% endfor %}
</select></label>
<button type="submit" id="run">Run</button>
<span class="muted">read-only: SELECT over the lake's tables; time travel with
<code>table VERSION AS OF n</code> or <code>table TIMESTAMP AS OF '2026-01-01 00:00:00'</code></span>
</form>
{% if refusal %}
<div class="message refused" id="refusal" role="alert">{{ refusal }}</div>
{% endif %}
{% if error %}
<div class="message error" id="error" role="alert"><strong>Query failed:</strong> {{ error }}</div>
{% endif %}
{% if result %}
<div class="pager">
{% if result.page > 1 %}<a href="{{ prev_href }}" id="prev">← previous</a>{% endif %}
<span>page <span id="page-number">{{ result.page }}</span> · {{ result.rows | length }} rows
· {{ "%.2f" | format(result.elapsed_s) }} s
{% if result.tables %} · tables: {{ result.tables | join(", ") }}{% endif %}</span>
{% if result.has_more %}<a href="{{ next_href }}" id="next">next →</a>{% endif %}
</div>
<table id="result"><thead><tr>{% for c in result.columns %}<th>{{ c }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in result.rows %}<tr>{% for v in row %}<td>{{ v | cell }}</td>{% endfor %}</tr>
{% else %}<tr><td colspan="{{ result.columns | length or 1 }}" class="muted">no rows</td></tr>
{% endfor %}</tbody></table>
{% elif not sql %}
<div class="message info">Tables:
{% for name in table_names %}<code>{{ name }}</code>{{ ", " if not loop.last }}{% endfor %}</div>
{% endif %}
{% endblock %}"""

_AUDITS = """{% extends "layout" %}{% block content %}
{% if pass_rates %}<p id="report-index">Reports of
<a href="{{ root }}/audits{{ ns_query }}" class="{{ 'here' if not pipeline else '' }}">every pipeline</a>
{% for p in pipelines %} · <a href="{{ root }}/audits?{{ p | pipeline_query(namespace_param) }}"
 class="{{ 'here' if p == pipeline else '' }}">{{ p }}</a>{% endfor %}</p>
<div class="charts">{% for svg in pass_rates %}{{ svg | safe }}{% endfor %}</div>{% endif %}
{% if dag_id %}<p>Audits of DAG <code>{{ dag_id }}</code>{% if run_id %}, run <code>{{ run_id }}</code>{% endif %}
· <a href="{{ root }}/audits{{ ns_query }}">all audits</a></p>{% endif %}
<table id="audits"><thead><tr><th>Audited</th><th>Pipeline</th><th>Suite</th><th>Interval</th><th>Result</th>
<th>Rows</th><th>Failures</th><th>Run</th><th>Report</th></tr></thead><tbody>
{% for a in audits %}
<tr data-audit="{{ a.audit_id }}"><td>{{ a.audited_at | when }}</td><td>{{ a.pipeline }}</td><td>{{ a.suite }}</td>
<td>{{ a.interval_start | interval(a.interval_end) }}</td>
<td class="audit-status {{ 'ok' if a.success else 'failed' }}">{{ "passed" if a.success else "failed" }}
{% if a.blocking and not a.success %} (blocking){% endif %}</td>
<td class="num">{{ a.rows }}</td>
<td>{% if a.failed_expectations %}{{ a.failed_expectations }}/{{ a.expectations }}
{% for f in (a.failures or [])[:3] %}<br><span class="muted">{{ f }}</span>{% endfor %}{% else %}
<span class="muted">0/{{ a.expectations }}</span>{% endif %}</td>
<td>{% if a.dag_id and a.dag_run_id %}
<a href="{{ airflow_root }}/dags/{{ a.dag_id | urlpart }}/runs/{{ a.dag_run_id | urlpart }}" target="_top"
 class="dag-run">{{ a.dag_id }}</a>
{% else %}{{ a.dag_id }}{% endif %}<br>
<span class="muted">{{ a.dag_run_id }}</span></td>
<td>{% if a.report_path %}<a class="report" href="{{ a.report_path | report }}">report</a>{% endif %}</td></tr>
{% else %}<tr><td colspan="9" class="muted">no audits{% if dag_id %} for this run{% endif %}</td></tr>{% endfor %}
</tbody></table>
{% endblock %}"""

_STREAMS = """{% extends "layout" %}{% block content %}
{% if notice %}<div class="message {{ notice_kind }}" id="notice" role="status">{{ notice }}</div>{% endif %}
<p class="muted">State from the checkpoint leases and heartbeats (what
<code>tidewater_supervise_streams</code> acts on); plots of the last {{ hours }} h from each query's progress ·
{% for h in (1, 6, 24) %}<a href="{{ root }}/streams?hours={{ h }}{{ ns_amp }}">{{ h }} h</a>
{{- " · " if not loop.last }}{% endfor %}
· <a href="{{ root }}/api/streams?hours={{ hours }}{{ ns_amp }}">JSON</a></p>
{% for s in streams %}
<section class="stream" id="stream-{{ s.pipeline }}" data-state="{{ s.health.state }}">
<h2>{{ s.namespace }}/{{ s.pipeline }}
<span class="state state-{{ s.health.state }}">{{ s.health.state | state_label }}</span></h2>
<p>{% if s.health.pid %}driver pid {{ s.health.pid }} · {% endif %}wanted {{ s.health.desired }}
{% if s.health.heartbeat_age_s is not none %} · last heartbeat
{{ "%.0f" | format(s.health.heartbeat_age_s) }} s ago{% endif %}
· {{ s.restarts }} restart(s) in the events below
{% if s.health.detail %}<br><span class="muted">{{ s.health.detail }}</span>{% endif %}
{% if s.health.error and s.health.error not in s.health.detail %}<br>
<span class="failed">{{ s.health.error }}</span>{% endif %}</p>
{% if can_control and s.namespace == namespace %}
<form method="post" class="actions" action="{{ root }}/streams/{{ s.pipeline | urlpart }}/control">
{% for action in actions %}<button type="submit" name="action" value="{{ action }}"
 id="{{ action }}-{{ s.pipeline }}">{{ action }}</button>
{% endfor %}<span class="muted">runs <code>{{ control_dag }}</code></span></form>
{% endif %}
<table class="queries"><thead><tr><th>Query</th><th>Last batch</th><th>Rows/s in · processed</th><th>Duration</th>
<th>Lag per partition (of what the broker retains)</th><th>State</th><th>Watermark</th><th>Late rows</th>
</tr></thead><tbody>
{% for q in s.queries %}
<tr data-query="{{ q.query }}"><td>{{ q.query }}</td>
<td>{{ q.batch_id }}<br><span class="muted">{{ q.batch_time | when }}</span></td>
<td class="num">{{ q.input_rows_per_second | rate }} · {{ q.processed_rows_per_second | rate }}</td>
<td class="num">{{ q.batch_duration_ms | millis }}</td>
<td>{% for p in q.partitions %}<span class="partition {{ p.verdict | replace(' ', '-') }}"
 data-partition="{{ p.partition }}"><code>{{ p.partition }}</code> {{ p.behind }}
{%- if p.retained is not none %} <span class="muted">of {{ p.retained }} retained
{%- if p.percent %} ({{ p.percent }} unread){% endif %}</span>
{%- if p.verdict == "at risk" %} <strong class="warn">retention deletes unread records soon</strong>
{%- elif p.verdict == "lost" %} <strong class="warn">records were deleted unread</strong>{% endif %}
{%- endif %}</span><br>
{% else %}<span class="muted">-</span>{% endfor %}</td>
<td class="num">{{ q.state_rows or 0 }} rows<br>
<span class="muted">{{ [q.state_memory_bytes or 0, q.state_files_bytes or 0] | max | size }}</span></td>
<td>{{ q.watermark or "" }}</td>
<td class="num">{{ q.rows_dropped_by_watermark_total or 0 }}{% if q.rows_held_ahead_of_clock_total %}<br>
<span class="muted">{{ q.rows_held_ahead_of_clock_total }} ahead of the clock</span>{% endif %}</td></tr>
{% else %}<tr><td colspan="8" class="muted">no batch yet</td></tr>{% endfor %}
</tbody></table>
{% if s.has_history %}<div class="charts">{% for svg in s.charts() %}{{ svg | safe }}{% endfor %}</div>
{% else %}<p class="muted no-history">no progress in the last {{ hours }} h</p>{% endif %}
<details><summary>Starts, stops and deaths ({{ s.events | length }})</summary>
<table class="events"><thead><tr><th>When</th><th>Event</th><th>Why</th></tr></thead><tbody>
{% for e in s.events %}<tr><td>{{ e.at | when }}</td><td>{{ e.event }}</td>
<td>{{ e.reason or e.error or e.detail or e.by or e.state or "" }}</td></tr>
{% else %}<tr><td colspan="3" class="muted">no events</td></tr>{% endfor %}</tbody></table></details>
</section>
{% else %}<p class="muted">no pipelines</p>{% endfor %}
{% endblock %}"""

_MESSAGE = """{% extends "layout" %}{% block content %}
<div class="message {{ kind }}" id="message" role="alert">{{ message }}</div>
{% if link %}<p><a href="{{ link }}" target="_top" id="message-link">{{ link_text }}</a></p>{% endif %}
{% endblock %}"""

NAV = (("streams", "Streams"), ("tables", "Tables"), ("sql", "SQL"), ("audits", "Audits"))
# The supervisor's states (tidewater.orchestration.supervisor) in words: "dead" is a driver that exited
# and will be relaunched; "failed" one that crash-looped and will not be until resumed.
STATE_LABELS = {
    "dead": "failed (exited; the supervisor relaunches it)",
    "failed": "crash-looping (stopped until resumed)",
}
PAGE_SIZES = (25, 50, 100, 500)


def _brief(metrics: Any) -> str:
    if not metrics:
        return ""
    items = metrics.items() if isinstance(metrics, Mapping) else []
    keep = [f"{k}={v}" for k, v in items if k.startswith("num") and v not in (0, None)]
    return ", ".join(keep[:6])


@lru_cache(maxsize=8)  # one compiled set of templates per mount path
def _environment(root: str) -> Environment:
    env = Environment(
        loader=DictLoader(
            {
                "layout": _LAYOUT,
                "tables": _TABLES,
                "history": _HISTORY,
                "sql": _SQL,
                "audits": _AUDITS,
                "message": _MESSAGE,
                "streams": _STREAMS,
            }
        ),
        autoescape=select_autoescape(default=True, default_for_string=True),
        undefined=ChainableUndefined,  # a missing field shows empty, not a 500
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        size=fmt.human_size,
        when=fmt.fmt_time,
        interval=fmt.fmt_interval,
        run=fmt.commit_run,
        commit_run=lambda commit: fmt.commit_run(_commit_metadata(commit)),
        cell=fmt.cell_text,
        brief=_brief,
        urlpart=lambda text: quote(str(text), safe=""),
        report=lambda path: report_href(root, path),
        rate=lambda value: f"{float(value or 0):,.0f}",
        millis=lambda ms: "" if ms is None else f"{float(ms) / 1000:,.1f} s",
        state_label=lambda state: STATE_LABELS.get(str(state), str(state)),
        pipeline_query=lambda pipeline, namespace: urlencode(
            {"pipeline": pipeline, **({"namespace": namespace} if namespace else {})}
        ),
    )
    return env


def _commit_metadata(commit: Mapping[str, Any]) -> dict[str, Any]:
    """A commit's labels wherever they sit: the commitInfo itself, the catalog's ``metadata``, userMetadata."""
    meta = dict(commit)
    for key in ("metadata", "userMetadata"):
        if isinstance(commit.get(key), Mapping):
            meta.update(commit[key])
    return meta


class Pages:
    """Renders pages for one request: knows the app's root path and the namespace shown."""

    def __init__(self, root: str, namespace: str, namespace_param: str | None = None) -> None:
        self.root = root.rstrip("/")
        # Airflow's own UI is served from the same root this app is mounted under (DAG run links).
        self.airflow_root = self.root.removesuffix(URL_PREFIX)
        self.namespace = namespace
        self.namespace_param = namespace_param or ""
        self.ns_query = f"?{urlencode({'namespace': namespace_param})}" if namespace_param else ""
        self._env = _environment(self.root)

    def _render(self, template: str, *, title: str, active: str = "", **values: Any) -> str:
        return self._env.get_template(template).render(
            title=title,
            active=active,
            nav=NAV,
            root=self.root,
            airflow_root=self.airflow_root,
            namespace=self.namespace,
            namespace_param=self.namespace_param,
            ns_query=self.ns_query,
            **values,
        )

    def tables(self, tables: Sequence[Any]) -> str:
        return self._render("tables", title="Lake tables", active="tables", tables=tables)

    def history(self, name: str, commits: Sequence[Mapping[str, Any]]) -> str:
        example = self.sql_query(f"SELECT * FROM {name} LIMIT 20")
        return self._render("history", title=f"History of {name}", commits=commits, example_query=example)

    def sql_query(self, sql: str, page: int = 1, page_size: int = 50) -> str:
        """The query string of a SQL page URL (without the ``?``)."""
        params: dict[str, Any] = {"sql": sql, "page": page, "page_size": page_size}
        if self.namespace_param:
            params["namespace"] = self.namespace_param
        return urlencode(params)

    def sql(
        self,
        *,
        sql: str,
        page_size: int,
        result: Any = None,
        refusal: str = "",
        error: str = "",
        table_names: Sequence[str] = (),
    ) -> str:
        prev_href = next_href = ""
        if result is not None:
            prev_href = f"{self.root}/sql?{self.sql_query(sql, result.page - 1, page_size)}"
            next_href = f"{self.root}/sql?{self.sql_query(sql, result.page + 1, page_size)}"
        return self._render(
            "sql",
            title="SQL",
            active="sql",
            sql=sql,
            page_size=page_size,
            sizes=sorted({*PAGE_SIZES, page_size}),
            result=result,
            refusal=refusal,
            error=error,
            prev_href=prev_href,
            next_href=next_href,
            table_names=table_names,
        )

    def audits(
        self,
        audits: Sequence[Mapping[str, Any]],
        *,
        dag_id: str = "",
        run_id: str = "",
        pipeline: str = "",
        pipelines: Sequence[str] = (),
        pass_rates: Sequence[str] = (),
    ) -> str:
        """The audit rows (of a run, or of every run: then with each pipeline's pass rate over time)."""
        title = "Data-quality report of this run" if run_id else f"Audits of {pipeline}" if pipeline else "Audits"
        return self._render(
            "audits",
            title=title,
            active="" if run_id else "audits",
            audits=audits,
            dag_id=dag_id,
            run_id=run_id,
            pipeline=pipeline,
            pipelines=pipelines,
            pass_rates=pass_rates,
        )

    def streams(
        self,
        streams: Sequence[Any],
        *,
        hours: float,
        can_control: bool,
        actions: Sequence[str],
        control_dag: str,
        notice: str = "",
        notice_kind: str = "info",
    ) -> str:
        ns_amp = f"&{urlencode({'namespace': self.namespace_param})}" if self.namespace_param else ""
        return self._render(
            "streams",
            title="Streams",
            active="streams",
            streams=streams,
            hours=f"{hours:g}",
            ns_amp=ns_amp,
            can_control=can_control,
            actions=actions,
            control_dag=control_dag,
            notice=notice,
            notice_kind=notice_kind,
        )

    def message(self, title: str, message: str, *, kind: str = "info", link: str = "", link_text: str = "") -> str:
        return self._render("message", title=title, message=message, kind=kind, link=link, link_text=link_text)
