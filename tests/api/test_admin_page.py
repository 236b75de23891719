"""The admin page's rendering (pure): names from the config are escaped, nothing external."""

from __future__ import annotations

from support.proxy_server import settings_from

from proxy.api.admin_page import render
from proxy.catalog import Catalog
from proxy.limiter.base import LimiterMode
from proxy.state_view import Reading, state


def test_names_are_escaped_and_the_page_is_self_contained() -> None:
    settings = settings_from(
        {
            "keys": [{"name": "<b>k</b>", "key": "sk-a"}],
            "models": [{"name": "m&<i>", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    html = render(state(settings, Catalog(settings), Reading(0.0, LimiterMode.MEMORY, {}, {}, [])))
    assert "<b>k</b>" not in html and "&lt;b&gt;k&lt;/b&gt;" in html
    assert "m&amp;&lt;i&gt;" in html and "m&<i>" not in html
    assert "<script" not in html and "<link" not in html and "src=" not in html


def test_teams_have_their_table_and_keys_name_their_team() -> None:
    settings = settings_from(
        {
            "teams": [{"name": "<t>", "rpm": 10}],
            "keys": [{"name": "k", "key": "sk-a", "team": "<t>"}],
            "models": [{"name": "m", "deployments": [{"id": "d", "base_url": "http://x/v1"}]}],
        }
    )
    html = render(state(settings, Catalog(settings), Reading(0.0, LimiterMode.MEMORY, {}, {}, [])))
    assert "<h2>Teams</h2>" in html and 'data-team="&lt;t&gt;"' in html
    assert 'data-window="rpm"' in html and "team &lt;t&gt;" in html
