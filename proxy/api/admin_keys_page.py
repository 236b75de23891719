"""``GET /admin/key-manager``: manage client keys and teams from a browser.

The page lists the keys (paged, as ``GET /admin/keys``) and the teams (as ``GET
/admin/teams``), and has forms to create, change, rotate and revoke keys (a key's team
chosen among the known ones, its windows, budgets and expiry) and to create, change and
delete teams. Their script sends each to the JSON API (``/admin/keys``,
``/admin/teams``) with the admin key typed into the page's password field, as an
``Authorization: Bearer`` header: the key is kept in that field only (no cookie, no
storage, never in a URL). The API takes bearer tokens only, no cookies and no Basic
credentials, and a cross-site page cannot add that header without a CORS preflight the
proxy never grants: so a forged form post gets 401 (CSRF-safe). A secret the API returns
is shown once, in the page, and is gone on reload. After a team's change the script reads
the teams again (the table and every team choice). No refresh, unlike the state page
(``/admin``): it would wipe what is being typed. The script is the page's own (a nonce in
its Content-Security-Policy); nothing external is loaded.
"""

from __future__ import annotations

import secrets
import time
from html import escape
from typing import Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.api.admin_teams import configured_team
from proxy.api.responses import error_response
from proxy.config.settings import ClientKey, Settings
from proxy.errors import ProxyError
from proxy.keys.listing import MAX_PER_PAGE, parse_page
from proxy.keys.store import RuntimeKeys
from proxy.keys.teams import RuntimeTeams
from proxy.limiter.base import window_name

__all__ = ["key_manager"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2733;background:#f6f7f9}
h1{font-size:1.3em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left}th{background:#eef1f5}
form{background:#fff;border:1px solid #dde2e8;padding:.6em;margin:.4em 0}
input,select,textarea{margin:0 .6em .3em 0;vertical-align:top}textarea{width:22em;height:3.2em}
input[inputmode=numeric]{width:7em}
output{display:block;white-space:pre-wrap;font-family:monospace;
background:#fff;border:1px solid #dde2e8;padding:.5em;min-height:1.5em}.muted{color:#8592a3}
"""

# Each form's fields become the JSON body; the path names the key or team where the API
# wants it. A team's change (data-teams) reads the teams again: the table, every choice.
_SCRIPT = """
const out = document.getElementById('result');
const NUMERIC = ['rpm', 'tpm', 'rpd', 'tpd', 'max_parallel', 'priority'];
function field(data, name, value) {
  if (NUMERIC.includes(name)) data[name] = Number(value);
  else if (name === 'models') data[name] = value.split(',').map(s => s.trim()).filter(Boolean);
  else if (name === 'limits' || name === 'budgets') {
    try { data[name] = JSON.parse(value); }
    catch (error) { throw new Error(`'${name}' is not JSON: ${error.message}`); }
  }
  else if (name === 'expires_at') data[name] = new Date(value).toISOString();
  else if (name === 'never_expires') data.expires_at = null;
  else if (name === 'team' && value === '-') data[name] = null;
  else data[name] = value;
}
function body(form) {
  const data = {};
  for (const [name, value] of new FormData(form)) {
    if (value === '' || name === 'target') continue;
    field(data, name, value);
  }
  return data;
}
function per(value) { return typeof value === 'number' ? value + 's' : String(value); }
function on(models) { return models && models.length ? ' on ' + models.join(' ') : ''; }
function windows(entry) {
  const parts = ['rpm', 'tpm', 'rpd', 'tpd'].filter(f => entry[f] != null)
    .map(f => f + ' ' + entry[f]);
  for (const rule of entry.limits || []) {
    const kind = Object.keys(rule).find(k => k !== 'per' && k !== 'models' && rule[k] != null);
    parts.push(`${kind} ${rule[kind]}/${per(rule.per)}${on(rule.models)}`);
  }
  return parts.join(', ') || 'unlimited';
}
function budgets(entry) {
  return (entry.budgets || []).map(b => {
    const kind = Object.keys(b).find(k => k !== 'period' && k !== 'models');
    return `${kind} ${b[kind]}/${b.period}${on(b.models)}`;
  }).join(', ');
}
function cell(text) {
  const td = document.createElement('td');
  td.textContent = text;
  return td;
}
function teamRow(team) {
  const row = document.createElement('tr');
  row.dataset.team = team.name;
  row.append(cell(team.name), cell(team.source), cell(windows(team)),
             cell(team.max_parallel ?? ''), cell(budgets(team)));
  return row;
}
function fill(select, teams) {
  const kept = [...select.options].filter(o => o.dataset.fixed !== undefined);
  const api = select.dataset.teams === 'api';
  const options = teams.filter(t => !api || t.source === 'api').map(t => {
    const option = document.createElement('option');
    option.value = option.textContent = t.name;
    return option;
  });
  select.replaceChildren(...kept, ...options);
}
async function refreshTeams(key) {
  const reply = await fetch('/admin/teams?per_page=1000', {cache: 'no-store',
    credentials: 'omit', headers: {'Authorization': 'Bearer ' + key}});
  if (!reply.ok) return;
  const teams = (await reply.json()).teams;
  document.getElementById('team-rows').replaceChildren(...teams.map(teamRow));
  for (const select of document.querySelectorAll('select[data-teams]')) fill(select, teams);
}
async function send(form) {
  const key = document.getElementById('admin-key').value;
  const target = encodeURIComponent(form.elements.target ? form.elements.target.value : '');
  const path = form.dataset.path.replace('{name}', target);
  const init = {method: form.dataset.method, cache: 'no-store', credentials: 'omit',
                headers: {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}};
  let status = 0, text = '';
  try {
    if (form.dataset.method !== 'DELETE') init.body = JSON.stringify(body(form));
    const reply = await fetch(path, init);
    status = reply.status;
    text = await reply.text();
    if (reply.ok && form.dataset.teams !== undefined) await refreshTeams(key);
  } catch (error) {
    text = error.message;
  }
  out.textContent = status + ' ' + (text || '(no content)');
  out.dataset.status = String(status);
  return status;
}
for (const form of document.querySelectorAll('form[data-path]')) {
  form.addEventListener('submit', (event) => { event.preventDefault(); send(form); });
}
"""

_LIMITS = '{"requests": 100, "per": "1h"}, {"tokens": 5000, "per": "1m", "models": ["m"]}'
_BUDGETS = '{"usd": 50, "period": "month"}, {"tokens": 2000000, "period": "day"}'


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _windows_and_budgets() -> str:
    """A form's windows (the shorthands, ``limits``), ``budgets`` (JSON lists) and what
    they do at their edge (``budget_edge``; none chosen: the default, or unchanged)."""
    return (
        '<input name="rpm" placeholder="rpm" inputmode="numeric">'
        '<input name="tpm" placeholder="tpm" inputmode="numeric">'
        '<input name="rpd" placeholder="rpd" inputmode="numeric">'
        '<input name="tpd" placeholder="tpd" inputmode="numeric">'
        '<input name="max_parallel" placeholder="max_parallel" inputmode="numeric">'
        f'<textarea name="limits" placeholder="{_e(f"limits (JSON): [{_LIMITS}]")}"></textarea>'
        f'<textarea name="budgets" placeholder="{_e(f"budgets (JSON): [{_BUDGETS}]")}"></textarea>'
        '<select name="budget_edge"><option value="">budget edge</option>'
        '<option value="refuse">refuse</option><option value="clamp">clamp</option></select>'
    )


def _limits(key: ClientKey) -> str:
    rules = key.limit_rules()
    return ", ".join(f"{window_name(r.kind, r.per)} {r.amount}" for r in rules) or "unlimited"


def _per(value: object) -> str:
    return f"{value:g}s" if isinstance(value, int | float) else str(value)


def _on(models: object) -> str:
    return " on " + " ".join(models) if isinstance(models, list) and models else ""


def team_windows(entry: dict[str, Any]) -> str:
    """A team's entry's windows as the script shows them (``windows``)."""
    parts = [f"{f} {entry[f]}" for f in ("rpm", "tpm", "rpd", "tpd") if entry.get(f) is not None]
    for rule in entry.get("limits") or ():
        kind = next(k for k in rule if k not in ("per", "models") and rule[k] is not None)
        parts.append(f"{kind} {rule[kind]}/{_per(rule['per'])}{_on(rule.get('models'))}")
    return ", ".join(parts) or "unlimited"


def team_budgets(entry: dict[str, Any]) -> str:
    """A team's entry's budgets as the script shows them (``budgets``)."""
    parts = []
    for b in entry.get("budgets") or ():
        kind = next(k for k in b if k not in ("period", "models"))
        parts.append(f"{kind} {b[kind]}/{b['period']}{_on(b.get('models'))}")
    return ", ".join(parts)


def _options(names: list[str]) -> str:
    return "".join(f'<option value="{_e(n)}">{_e(n)}</option>' for n in names)


def _team_select(teams: list[dict[str, Any]], *, fixed: str, which: str = "all") -> str:
    """A choice of team (``which``: ``all`` teams, or the ``api``'s), after ``fixed``
    options (kept when the script reads the teams again)."""
    names = [t["name"] for t in teams if which == "all" or t["source"] == "api"]
    name = "team" if which == "all" else "target"
    return f'<select name="{name}" data-teams="{which}">{fixed}{_options(names)}</select>'


def _key_forms(teams: list[dict[str, Any]]) -> str:
    create_team = _team_select(teams, fixed='<option value="" data-fixed>no team</option>')
    edit_team = _team_select(
        teams,
        fixed='<option value="" data-fixed>team unchanged</option>'
        '<option value="-" data-fixed>no team</option>',
    )
    return (
        '<h2>Create a key</h2><form id="create" data-method="POST" data-path="/admin/keys">'
        '<input name="name" placeholder="name" required>'
        f"{create_team}{_windows_and_budgets()}"
        '<input name="models" placeholder="models (comma-separated)">'
        '<label>expires <input name="expires_at" type="datetime-local"></label>'
        "<button>Create</button></form>"
        '<h2>Change a key</h2><form id="edit" data-method="PATCH" data-path="/admin/keys/{name}">'
        '<input name="target" placeholder="name" required>'
        f"{edit_team}{_windows_and_budgets()}"
        '<label>expires <input name="expires_at" type="datetime-local"></label>'
        '<label><input name="never_expires" type="checkbox"> never expires</label>'
        '<button>Change</button> <span class="muted">empty fields stay as they are</span></form>'
        '<h2>Rotate</h2><form id="rotate" data-method="POST"'
        ' data-path="/admin/keys/{name}/rotate">'
        '<input name="target" placeholder="name" required>'
        '<input name="grace" placeholder="grace (e.g. 1h)">'
        "<button>Rotate</button></form>"
        '<h2>Revoke</h2><form id="revoke" data-method="DELETE" data-path="/admin/keys/{name}">'
        '<input name="target" placeholder="name" required><button>Revoke</button></form>'
    )


def _team_section(teams: list[dict[str, Any]]) -> str:
    rows = "".join(
        f'<tr data-team="{_e(t["name"])}"><td>{_e(t["name"])}</td><td>{_e(t["source"])}</td>'
        f"<td>{_e(team_windows(t))}</td><td>{_e(t.get('max_parallel', ''))}</td>"
        f"<td>{_e(team_budgets(t))}</td></tr>"
        for t in teams
    )
    return (
        '<h2 id="teams">Teams</h2><p class="muted">teams of the config file change only there'
        " (and a reload); a team its keys still name cannot be deleted</p>"
        "<table><thead><tr><th>name</th><th>source</th><th>limits</th><th>max_parallel</th>"
        f'<th>budgets</th></tr></thead><tbody id="team-rows">{rows}</tbody></table>'
        '<h3>Create a team</h3><form id="team-create" data-method="POST"'
        ' data-path="/admin/teams" data-teams>'
        f'<input name="name" placeholder="name" required>{_windows_and_budgets()}'
        "<button>Create</button></form>"
        '<h3>Change a team</h3><form id="team-edit" data-method="PATCH"'
        ' data-path="/admin/teams/{name}" data-teams>'
        f"{_team_select(teams, fixed='', which='api')}{_windows_and_budgets()}"
        '<button>Change</button> <span class="muted">empty fields stay as they are</span></form>'
        '<h3>Delete a team</h3><form id="team-delete" data-method="DELETE"'
        ' data-path="/admin/teams/{name}" data-teams>'
        f"{_team_select(teams, fixed='', which='api')}<button>Delete</button></form>"
    )


def render(
    rows: list[tuple[str, str, str, str]],
    page: int,
    pages: int,
    nonce: str,
    teams: list[dict[str, Any]] | None = None,
) -> str:
    """The page: ``rows`` are (name, source, team, limits) of one page of keys; ``teams``
    every team's entry (as ``GET /admin/teams`` lists them)."""
    teams = teams or []
    table = "".join(
        f'<tr data-key="{_e(n)}"><td>{_e(n)}</td><td>{_e(s)}</td><td>{_e(t)}</td>'
        f"<td>{_e(lim)}</td></tr>"
        for n, s, t, lim in rows
    )
    nav = " ".join(
        f'<a href="?page={p}">{p}</a>' if p != page else f"<b>{p}</b>"
        for p in range(max(1, page - 5), min(pages, page + 5) + 1)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>llm-proxy keys</title><style>{_CSS}</style></head><body>"
        '<h1>Client keys and teams</h1><p class="muted"><a href="/admin">state</a> &middot;'
        ' <a href="#teams">teams</a> &middot; keys of the config file change only there'
        " (and a reload)</p>"
        '<label>Admin key <input id="admin-key" type="password" autocomplete="off"></label>'
        f"{_key_forms(teams)}"
        '<h2>Result</h2><output id="result"></output>'
        f"<h2>Keys</h2><p>page {nav} of {pages}</p>"
        "<table><tr><th>name</th><th>source</th><th>team</th><th>limits</th></tr>"
        f"{table}</table>{_team_section(teams)}"
        f'<script nonce="{nonce}">{_SCRIPT}</script></body></html>'
    )


def _every_team(settings: Settings, teams: RuntimeTeams) -> list[dict[str, Any]]:
    """The config's teams, then the admin API's (the first ``MAX_PER_PAGE``)."""
    configured = [t.name for t in settings.teams]
    _, records = teams.listing(configured, 1, len(configured) + MAX_PER_PAGE)
    return [configured_team(t) for t in settings.teams] + [r.public() for r in records]


async def key_manager(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    keys: RuntimeKeys = request.app.state.runtime_keys
    try:
        page, per_page = parse_page(request.query_params)
    except ProxyError as error:
        return error_response(error)
    configured = settings.keys
    chosen, records = keys.page(configured.by_name(), page, per_page)
    rows = []
    for name in chosen.configured:
        key = configured[configured.by_name()[name]]
        rows.append((name, "config", key.team or "", _limits(key)))
    now = time.time()
    for record in records:
        source = "api (expired)" if record.expired(now) else "api"
        key = record.client_key()[0]
        rows.append((record.name, source, key.team or "", _limits(key)))
    nonce = secrets.token_urlsafe(16)
    policy = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'none';"
        f" script-src 'nonce-{nonce}'; connect-src 'self'; form-action 'none';"
        " frame-ancestors 'none'; base-uri 'none'"
    )
    teams = _every_team(settings, request.app.state.runtime_teams)
    return HTMLResponse(
        render(rows, page, chosen.pages, nonce, teams),
        headers={"cache-control": "no-store", "content-security-policy": policy},
    )
