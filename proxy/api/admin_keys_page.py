"""``GET /admin/key-manager``: create, rotate and revoke client keys from a browser.

The page lists the keys (paged, as ``GET /admin/keys``) and has three forms. Their
script sends each to the JSON API (``/admin/keys``) with the admin key typed into the
page's password field, as an ``Authorization: Bearer`` header: the key is kept in that
field only (no cookie, no storage, never in a URL). The API takes bearer tokens only, no
cookies and no Basic credentials, and a cross-site page cannot add that header without a
CORS preflight the proxy never grants: so a forged form post gets 401 (CSRF-safe). A
secret the API returns is shown once, in the page, and is gone on reload. No refresh,
unlike the state page (``/admin``): it would wipe what is being typed. The script is the
page's own (a nonce in its Content-Security-Policy); nothing external is loaded.
"""

from __future__ import annotations

import secrets
import time
from html import escape

from starlette.requests import Request
from starlette.responses import HTMLResponse, Response

from proxy.api.responses import error_response
from proxy.config import ClientKey, Settings
from proxy.errors import ProxyError
from proxy.keys.listing import parse_page
from proxy.keys.store import RuntimeKeys
from proxy.limiter.base import window_name

__all__ = ["key_manager"]

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d2733;background:#f6f7f9}
h1{font-size:1.3em}h2{font-size:1.1em;margin:1.2em 0 .4em}
table{border-collapse:collapse;background:#fff;width:100%}
th,td{border:1px solid #dde2e8;padding:.3em .5em;text-align:left}th{background:#eef1f5}
form{background:#fff;border:1px solid #dde2e8;padding:.6em;margin:.4em 0}
input{margin:0 .6em .3em 0}output{display:block;white-space:pre-wrap;font-family:monospace;
background:#fff;border:1px solid #dde2e8;padding:.5em;min-height:1.5em}.muted{color:#8592a3}
"""

# Each form's fields become the JSON body; the path names the key where the API wants it.
_SCRIPT = """
const out = document.getElementById('result');
function body(form) {
  const data = {};
  for (const [name, value] of new FormData(form)) {
    if (value === '' || name === 'target') continue;
    const numeric = ['rpm', 'tpm', 'rpd', 'tpd', 'max_parallel', 'priority'];
    if (numeric.includes(name)) data[name] = Number(value);
    else if (name === 'models') data[name] = value.split(',').map(s => s.trim()).filter(Boolean);
    else data[name] = value;
  }
  return data;
}
async function send(form) {
  const key = document.getElementById('admin-key').value;
  const target = encodeURIComponent(form.elements.target ? form.elements.target.value : '');
  const path = form.dataset.path.replace('{name}', target);
  const init = {method: form.dataset.method, cache: 'no-store', credentials: 'omit',
                headers: {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'}};
  if (form.dataset.method !== 'DELETE') init.body = JSON.stringify(body(form));
  const reply = await fetch(path, init);
  const text = await reply.text();
  out.dataset.status = String(reply.status);
  out.textContent = reply.status + ' ' + (text || '(no content)');
  return reply.status;
}
for (const form of document.querySelectorAll('form[data-path]')) {
  form.addEventListener('submit', (event) => { event.preventDefault(); send(form); });
}
"""


def _limits(key: ClientKey) -> str:
    rules = key.limit_rules()
    return ", ".join(f"{window_name(r.kind, r.per)} {r.amount}" for r in rules) or "unlimited"


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def render(rows: list[tuple[str, str, str]], page: int, pages: int, nonce: str) -> str:
    """The page: ``rows`` are (name, source, limits) of one page of keys."""
    table = "".join(
        f'<tr data-key="{_e(n)}"><td>{_e(n)}</td><td>{_e(s)}</td><td>{_e(lim)}</td></tr>'
        for n, s, lim in rows
    )
    nav = " ".join(
        f'<a href="?page={p}">{p}</a>' if p != page else f"<b>{p}</b>"
        for p in range(max(1, page - 5), min(pages, page + 5) + 1)
    )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>llm-proxy keys</title><style>{_CSS}</style></head><body>"
        '<h1>Client keys</h1><p class="muted"><a href="/admin">state</a> &middot; keys of the'
        " config file change only there (and a reload)</p>"
        '<label>Admin key <input id="admin-key" type="password" autocomplete="off"></label>'
        '<h2>Create</h2><form id="create" data-method="POST" data-path="/admin/keys">'
        '<input name="name" placeholder="name" required>'
        '<input name="rpm" placeholder="rpm" inputmode="numeric">'
        '<input name="tpm" placeholder="tpm" inputmode="numeric">'
        '<input name="models" placeholder="models (comma-separated)">'
        '<input name="expires_at" placeholder="expires_at (RFC 3339)">'
        "<button>Create</button></form>"
        '<h2>Rotate</h2><form id="rotate" data-method="POST"'
        ' data-path="/admin/keys/{name}/rotate">'
        '<input name="target" placeholder="name" required>'
        '<input name="grace" placeholder="grace (e.g. 1h)">'
        "<button>Rotate</button></form>"
        '<h2>Revoke</h2><form id="revoke" data-method="DELETE" data-path="/admin/keys/{name}">'
        '<input name="target" placeholder="name" required><button>Revoke</button></form>'
        '<h2>Result</h2><output id="result"></output>'
        f"<h2>Keys</h2><p>page {nav} of {pages}</p>"
        f"<table><tr><th>name</th><th>source</th><th>limits</th></tr>{table}</table>"
        f'<script nonce="{nonce}">{_SCRIPT}</script></body></html>'
    )


async def key_manager(request: Request) -> Response:
    settings: Settings = request.app.state.settings
    keys: RuntimeKeys = request.app.state.runtime_keys
    try:
        page, per_page = parse_page(request.query_params)
    except ProxyError as error:
        return error_response(error)
    configured = settings.keys
    chosen, records = keys.page(configured.by_name(), page, per_page)
    rows = [(n, "config", _limits(configured[configured.by_name()[n]])) for n in chosen.configured]
    now = time.time()
    for record in records:
        source = "api (expired)" if record.expired(now) else "api"
        rows.append((record.name, source, _limits(record.client_key()[0])))
    nonce = secrets.token_urlsafe(16)
    policy = (
        "default-src 'none'; style-src 'unsafe-inline'; img-src 'none';"
        f" script-src 'nonce-{nonce}'; connect-src 'self'; form-action 'none';"
        " frame-ancestors 'none'; base-uri 'none'"
    )
    return HTMLResponse(
        render(rows, page, chosen.pages, nonce),
        headers={"cache-control": "no-store", "content-security-policy": policy},
    )
