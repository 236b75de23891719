"""The configured models, deployments and keys, turned into what the hot path needs.

Built once at start-up (pure): per deployment its limiter ``DeploymentLimits``, upstream
URLs and timeout; per client key its ``KeyLimits``. ``share`` is this process's part of
every budget when budgets are not shared (the in-memory backend under N workers).
"""

from __future__ import annotations

import dataclasses
import ssl
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import httpx

from proxy.catalog.announced import Announced
from proxy.catalog.pacing import Pacing, pacing_headroom
from proxy.config.keys import ConfigKeys
from proxy.config.model_names import ModelNames, is_pattern
from proxy.config.settings import (
    BudgetSpec,
    ClientKey,
    Deployment,
    LimitRule,
    ModelGroup,
    PriceSpec,
    RoutingConfig,
    Settings,
    Team,
)
from proxy.errors import ProxyError
from proxy.limiter.base import (
    KEY,
    MINUTE,
    TEAM,
    DeploymentLimits,
    KeyLimits,
    Quota,
    Rate,
    Window,
    scoped_name,
    window_name,
)
from proxy.limiter.core.quota import quota_name
from proxy.money.pricing import FREE, Price, dearest
from proxy.providers import Provider, provider_of
from proxy.providers.base import ShapesByModel, Wire
from proxy.translate import reachable

__all__ = ["Catalog", "DeploymentRoute", "GroupRoute", "TeamLookup", "for_model", "key_limits"]

# A deployment's request bucket holds one request unless configured: requests then go
# 60/rpm seconds apart, which no sliding-window upstream limit can reject...
DEFAULT_DEPLOYMENT_BURST = 1
# ...provided they also arrive that far apart: network and event-loop jitter can bring
# two requests a window apart a few milliseconds closer, so windows of a minute or less
# are paced below their configured limit, as if each turn could arrive up to the pacing
# margin late (``routing.pacing_margin``: measured, ``catalog/pacing.py``, or fixed): N + 1
# turns then span a window plus the margin, so no upstream window of this long or longer
# sees more than N (upstreams enforce per-minute limits over windows of a second or more:
# OpenAI's are "quantized", Azure's 1-10 s). Only windows of a minute or less pace; on a
# longer one (rpd: 5) the headroom would cost a whole request, and it never lowers the
# largest request a window admits. (The headroom for a margin: ``pacing.pacing_headroom``.)
DEPLOYMENT_HEADROOM = 0.01  # the headroom of a margin of 0: 1%, pacing.NETWORK_MARGIN


def fixed_margin(routing: RoutingConfig) -> float | None:
    """``routing.pacing_margin`` in seconds; None: ``auto`` (measured)."""
    margin = routing.pacing_margin
    return None if margin == "auto" else float(margin)


def reserved_ahead(routing: RoutingConfig) -> float:
    """How far ahead turns are reserved at most: the fair share's lookahead, or max_wait
    without one (how fast a measured margin may narrow: catalog/pacing.py)."""
    return routing.lookahead if routing.lookahead > 0 else routing.max_wait


EGRESS = "proxy.egress"  # the request extension the upstream transport reads


def shape_urls(d: Deployment, group: str = "") -> dict[str, tuple[httpx.URL, str]]:
    """Where the deployment serves each API shape its provider speaks (those of its
    model, or of its ``group``'s name: ``ShapesByModel``), parsed and as text, by shape
    name (``providers``: OpenAI's ``{base_url}/{shape}``, Azure's
    ``{base_url}/openai/deployments/{deployment}/{shape}?api-version=...``)."""
    provider = provider_of(d.provider)
    shapes = provider.shapes
    if isinstance(provider, ShapesByModel):
        shapes = provider.shapes_for(d.model or group)
    urls = {shape: httpx.URL(provider.url(d, shape)) for shape in sorted(shapes)}
    return {shape: (url, str(url)) for shape, url in urls.items()}


def body_models(d: Deployment) -> dict[str, str]:
    """The body's ``model`` per shape where the provider names it (``Provider.body_model``)."""
    provider = provider_of(d.provider)
    models = {shape: provider.body_model(d, shape) for shape in sorted(provider.shapes)}
    return {shape: model for shape, model in models.items() if model is not None}


@dataclass(frozen=True, slots=True)
class Egress:
    """How the transport reaches a deployment beyond its URL. ``ssl`` None: the system's
    trust store, verified (the common case, untouched); ``proxy`` None: the environment's
    HTTPS_PROXY / HTTP_PROXY / NO_PROXY decide."""

    ssl: ssl.SSLContext | None = None
    proxy: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    credential: tuple[str, str] | None = None  # the key's header (its provider's)
    defaults: tuple[tuple[str, str], ...] = ()  # sent unless the client sent that header


def egress(d: Deployment) -> Egress:
    """Built once per deployment: TLS context, egress proxy, extra headers, credential."""
    tls = d.tls
    context = None
    if tls.ca_file or tls.cert_file or not tls.verify:
        context = ssl.create_default_context(cafile=tls.ca_file or None)
        if tls.cert_file:
            context.load_cert_chain(tls.cert_file, tls.key_file or None)
        if not tls.verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    headers = tuple((name, value.get_secret_value()) for name, value in d.headers.items())
    provider = provider_of(d.provider)
    return Egress(
        context,
        d.proxy_url.get_secret_value() or None,
        headers,
        provider.credential(d),
        provider.default_headers,
    )


@dataclass(frozen=True, slots=True)
class DeploymentRoute:
    config: Deployment
    group: str
    limits: DeploymentLimits
    # The model it is sent: its ``model:``, else its group's name; None (a pattern
    # group's deployment without ``model:``): the name the client asked for.
    upstream_model: str | None
    # Built once: the upstream URL per API shape it speaks (parsed, and as text) and the
    # request's extensions (the timeout, as httpx spells it, and how to reach it).
    urls: dict[str, tuple[httpx.URL, str]]
    extensions: dict[str, object]
    # Its provider, looked up once (read twice per answer: docs/performance.md).
    provider: Provider
    # ``config.id``, a field: read some nine times per request, a property call each.
    id: str
    price: Price = FREE  # its own, else its group's; unpriced: free
    # The body's ``model`` for the shapes whose provider names it otherwise (Azure's
    # Responses API: the Azure deployment): ``model_for``.
    body_models: dict[str, str] = dataclasses.field(default_factory=dict)
    margin: float = 0.0  # the pacing margin ``limits`` are paced with
    # How its requests differ on the wire (the model in the URL, a signature, a stream
    # framed otherwise): ``Provider.wire``, made once; None: the common case.
    wire: Wire | None = None

    @property
    def weight(self) -> float:
        return self.config.weight

    def model_for(self, shape: str) -> str | None:
        """The ``model`` the forwarded body of the shape named ``shape`` names (None:
        the client's own, as it asked)."""
        if not self.body_models:  # the usual case: one model for every shape
            return self.upstream_model
        return self.body_models.get(shape, self.upstream_model)

    def target(self, shape: str) -> tuple[httpx.URL, str]:
        """The URL of the shape named ``shape``, parsed and as text."""
        return self.urls[shape]

    def speaks(self, shape: str) -> bool:
        """Whether its provider serves the shape named ``shape``."""
        return shape in self.urls


@dataclass(frozen=True, slots=True)
class GroupRoute:
    name: str
    deployments: tuple[DeploymentRoute, ...]
    # The names of the API shapes some deployment speaks, or serves through translation
    # (proxy/translate): one set lookup per request.
    shapes: frozenset[str]
    # Those every deployment speaks: a request of one needs no translation anywhere.
    common: frozenset[str] = frozenset()


def window(
    rule: LimitRule,
    share: float,
    capacity: float | None,
    headroom: float = 0.0,
    *,
    paced: bool = False,
) -> Window:
    """One configured limit as a limiter window: ``share`` of it (this process's part
    when budgets are not shared), refilled ``headroom`` below it, holding ``capacity``
    units at once (default: the whole window's allowance). ``paced``: units are spent at
    the window's rate, one request ahead at most, and a request up to the whole
    allowance (headroom or not) still goes (alone)."""
    allowance = rule.amount * share
    limit = allowance * (1.0 - headroom)
    rate = Rate(
        limit=limit,
        period=rule.per,
        capacity=max(capacity or limit, 1.0),
        ceiling=allowance if paced else None,
    )
    return Window(scoped_name(window_name(rule.kind, rule.per), rule.models), rule.kind, rate)


def timeout_extension(seconds: float) -> dict[str, float]:
    """The per-request timeout extension (httpx's shape, which the upstream client reads):
    connect (at most 10 s) and each read."""
    connect = min(seconds, 10.0)
    return {"connect": connect, "read": seconds, "write": seconds, "pool": connect}


def deployment_limits(
    deployment: Deployment, share: float = 1.0, pacing_margin: float = 0.0
) -> DeploymentLimits:
    burst = deployment.burst or DEFAULT_DEPLOYMENT_BURST
    headroom = pacing_headroom(pacing_margin)

    def spec(rule: LimitRule) -> Window:
        # Within a minute, requests go `burst` at a time and tokens one request ahead of
        # their pace at most: upstreams enforce per-minute limits over windows of a few
        # seconds (OpenAI's are "quantized", Azure's 1-10 s), so over any window of
        # W >= 1 s at most tpm x W / 60 tokens plus one request go out; a request as
        # large as the whole minute's allowance still goes, alone. A longer window only
        # caps the total.
        if rule.per > MINUTE:
            return window(rule, share, None)
        if rule.kind == "requests":
            return window(rule, share, burst, headroom)
        return window(rule, share, 1.0, headroom, paced=True)

    return DeploymentLimits(
        id=deployment.id,
        windows=tuple(spec(rule) for rule in deployment.limit_rules()),
        # A half-open probe is out at most as long as the call may take.
        probe_timeout=deployment.timeout,
    )


def key_limits(
    key: ClientKey | Team, share: float = 1.0, team: KeyLimits | None = None
) -> KeyLimits:
    """An owner's windows (a key's, or a team's: ``Team``), holding their whole allowance
    (50 RPM: 50 at once); a key in a team carries ``team``'s. Its budgets too."""
    scope = TEAM if isinstance(key, Team) else KEY
    return KeyLimits(
        name=key.name,
        windows=tuple(window(rule, share, None) for rule in key.limit_rules()),
        max_parallel=(
            max(1, int(key.max_parallel * share)) if key.max_parallel is not None else None
        ),
        team=team,
        scope=scope,
        quotas=tuple(
            budget(b, share, owner=key.name, scope=scope, clamp=key.budget_edge == "clamp")
            for b in key.budgets
        ),
    )


def budget(
    spec: BudgetSpec,
    share: float = 1.0,
    *,
    owner: str,
    scope: str = "key",
    clamp: bool = False,
) -> Quota:
    """One configured budget of ``owner`` (a key's, or a ``scope`` ``team``'s) as a
    limiter quota (``share`` of it: this process's part when budgets are not shared);
    ``clamp``: its owner's ``budget_edge`` is ``clamp``."""
    models = tuple(sorted(spec.models or ()))
    return Quota(
        quota_name(spec.kind, spec.period, models),
        spec.kind,
        spec.limit * share,
        spec.period,
        models,
        scope,
        owner,
        clamp,
    )


def price(spec: PriceSpec | None) -> Price:
    """A configured price; every free one is ``FREE`` itself (the request path asks
    ``price is FREE``: an identity test, not a dataclass comparison)."""
    if spec is None:
        return FREE
    built = Price(
        input=spec.input,
        output=spec.output,
        cached_input=spec.cached_input,
        cache_read=spec.cache_read,
        cache_write=spec.cache_write,
    )
    return FREE if built == FREE else built


_Built = TypeVar("_Built", Window, Quota)


def for_model(limits: KeyLimits, owner: ClientKey | Team, model: str) -> KeyLimits:
    """``limits`` (built from ``owner``: its windows and budgets, in order) without the
    windows and budgets that count other models' requests than ``model``'s (itself when
    none is left out): the one place a ``models`` filter is applied."""
    windows = _counting(limits.windows, owner.limit_rules(), model)
    quotas = _counting(limits.quotas, owner.budgets, model)
    if len(windows) == len(limits.windows) and len(quotas) == len(limits.quotas):
        return limits
    return replace(limits, windows=windows, quotas=quotas)


def _counting(
    built: Sequence[_Built], specs: Sequence[LimitRule | BudgetSpec], model: str
) -> tuple[_Built, ...]:
    """Those of ``built`` (one per spec, in order) whose spec counts ``model``."""
    return tuple(b for b, spec in zip(built, specs, strict=True) if _counts(spec, model))


def _counts(spec: LimitRule | BudgetSpec, model: str) -> bool:
    return not spec.models or model in spec.models


def _without(limits: KeyLimits, other: KeyLimits) -> KeyLimits:
    """``limits``' windows and budgets that ``other`` (the same owner's, asked for another
    model) lacks, and its team's likewise (kept, if empty: a team's key's windows are
    stored under the team); no parallel slots."""
    windows = {w.name for w in other.windows}
    quotas = {q.name for q in other.quotas}
    team = limits.team
    return KeyLimits(
        name=limits.name,
        windows=tuple(w for w in limits.windows if w.name not in windows),
        team=None if team is None or other.team is None else _without(team, other.team),
        scope=limits.scope,
        quotas=tuple(q for q in limits.quotas if q.name not in quotas),
    )


class TeamLookup(Protocol):
    """The teams of the admin API (``keys/teams.RuntimeTeams``): ``team`` is the one of
    a name (None: none; raises its 503 while it cannot know); ``on_gone`` hears the name
    of each team it no longer has."""

    on_gone: Callable[[str], None]

    def team(self, name: str) -> Team | None: ...


class _TeamLimits:
    """A team's limits, and per model group the windows and budgets that apply (built on
    first use)."""

    __slots__ = ("_by_model", "limits", "scoped", "team")

    def __init__(self, team: Team, share: float) -> None:
        self.limits = key_limits(team, share)
        self.team = team
        self.scoped = team.model_scoped
        self._by_model: dict[str, KeyLimits] = {}

    def for_model(self, model: str) -> KeyLimits:
        if not self.scoped:
            return self.limits
        built = self._by_model.get(model)
        if built is None:
            built = self._by_model[model] = for_model(self.limits, self.team, model)
        return built


def _pacing(routing: RoutingConfig, pacing: Pacing | None) -> Pacing:
    """``pacing`` (the process's), else one of ``routing.pacing_margin``'s own."""
    if pacing is None:
        return Pacing(fixed_margin(routing), depth=reserved_ahead(routing))
    return pacing


def _repaced(deployment: DeploymentRoute, share: float, margin: float) -> DeploymentLimits:
    """``deployment``'s limits paced with ``margin`` (the margin in force moved)."""
    if margin == deployment.margin:
        return deployment.limits
    return deployment_limits(deployment.config, share, margin)


def _group(group: ModelGroup, share: float, pacing_margin: float) -> GroupRoute:
    deployments = tuple(
        DeploymentRoute(
            config=d,
            group=group.name,
            limits=deployment_limits(d, share, pacing_margin),
            margin=pacing_margin,
            upstream_model=d.model or (None if is_pattern(group.name) else group.name),
            urls=shape_urls(d, group.name),
            extensions={"timeout": timeout_extension(d.timeout), EGRESS: egress(d)},
            provider=provider_of(d.provider),
            id=d.id,
            price=price(d.price or group.price),
            body_models=body_models(d),
            wire=provider_of(d.provider).wire(d),
        )
        for d in group.deployments
    )
    shapes = reachable(frozenset(name for d in deployments for name in d.urls))
    common = frozenset.intersection(*(frozenset(d.urls) for d in deployments))
    return GroupRoute(name=group.name, deployments=deployments, shapes=shapes, common=common)


def _exact_routes(names: ModelNames, groups: Mapping[str, GroupRoute]) -> dict[str, GroupRoute]:
    """Each exact name (a group's, an alias) to its group: ``Catalog.route``'s lookup."""
    return {name: groups[group] for name, group in names.exact.items()}


class _KeyLimits(Mapping[str, KeyLimits]):
    """The config keys' limits by name (their team's included), each built on first use:
    a config of 100,000 keys costs a dict of names at start-up and reload, not 100,000
    sets of windows."""

    def __init__(
        self, keys: Sequence[ClientKey], share: float, teams: Mapping[str, _TeamLimits]
    ) -> None:
        self._keys = ConfigKeys.of(keys)
        self._share = share
        self._teams = teams
        self._built: dict[str, KeyLimits] = {}

    def __getitem__(self, name: str) -> KeyLimits:
        built = self._built.get(name)
        if built is None:
            key = self._keys.get(name)
            if key is None:
                raise KeyError(name)
            team = self._teams.get(key.team) if key.team is not None else None
            limits = key_limits(key, self._share, None if team is None else team.limits)
            built = self._built[name] = limits
        return built

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys.names())

    def built(self) -> list[KeyLimits]:
        return list(self._built.values())

    def __len__(self) -> int:
        return len(self._keys)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._keys.position(name) is not None


class Catalog:
    def __init__(
        self,
        settings: Settings,
        share: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
        pacing: Pacing | None = None,
    ) -> None:
        # The pacing margin in force (measured or fixed): the process's, carried over by
        # a reload (``carry_over``); the limits below are paced with its margin now, and
        # built again as it moves (``Announced.limits``).
        self.routing = settings.routing
        self.pacing = _pacing(settings.routing, pacing)
        self.pacing_margin = self.pacing.margin()
        self.groups = {g.name: _group(g, share, self.pacing_margin) for g in settings.models}
        # The names clients may send: each group's, its aliases, its pattern (``route``).
        self.names = ModelNames.of(settings.models)
        self._exact = _exact_routes(self.names, self.groups)
        self._teams = {t.name: _TeamLimits(t, share) for t in settings.teams}
        self.team_limits: Mapping[str, KeyLimits] = {
            name: t.limits for name, t in self._teams.items()
        }
        self._key_limits = _KeyLimits(settings.keys, share, self._teams)
        self.key_limits: Mapping[str, KeyLimits] = self._key_limits
        # The teams of the admin API (set by the pipeline), for keys naming a team the
        # config does not have; what was built of each, until its record changes.
        self.runtime_teams: TeamLookup | None = None
        self._api_teams: dict[str, _TeamLimits] = {}
        # Per (key, model group): the limits its requests are checked against, and the
        # key's limits and team they were made from (an API key's or an API team's
        # change makes new ones).
        self._asks: dict[tuple[str, str], tuple[KeyLimits, _TeamLimits | None, KeyLimits]] = {}
        self.fallbacks = settings.routing.fallbacks
        # Per group, the dearest price a request to it may be served at (its deployments
        # and its fallbacks'): what a budget in dollars reserves.
        self.dearest: dict[str, Price] = {
            name: dearest(
                d.price
                for g in (name, *self.fallbacks.get(name, ()))
                if g in self.groups
                for d in self.groups[g].deployments
            )
            for name in self.groups
        }
        self.prices: dict[str, Price] = {
            d.id: d.price for g in self.groups.values() for d in g.deployments
        }
        # The group of each deployment: what served a request (its spend is that model's).
        self.group_of: dict[str, str] = {
            d.id: g.name for g in self.groups.values() for d in g.deployments
        }
        self.share = share
        # What upstreams announce of their limits, lowering the configured ones for a
        # while: the one part of the catalog that changes as it serves (announced.py).
        self.announced = Announced(share, self.pacing, clock, _repaced)
        # The one place a deployment's limits come from, for every limiter operation:
        # configured, this process's share of them, paced no faster than its upstream
        # announces. (Announced's own method: a call less on every reservation and
        # settlement.) How fast its windows refill after 429s is the limiter's business.
        self.limits: Callable[[DeploymentRoute], DeploymentLimits] = self.announced.limits

    def route(self, name: str) -> GroupRoute | None:
        """The group that serves the model name ``name`` a client sent: by its name or
        an alias, else the longest pattern that matches (model_names.py); None: none."""
        group = self._exact.get(name)  # the usual case: one lookup
        if group is None and self.names.patterns:
            found = self.names.resolve(name)
            group = None if found is None else self.groups[found]
        return group

    def held(self) -> list[object]:
        """The key limits built so far (a retired catalog's are freed off the event loop:
        release.py)."""
        return [*self._key_limits.built(), *self._asks.values()]

    def _team(self, name: str | None) -> _TeamLimits | None:
        """The team named ``name``: the config's (it wins), else the admin API's (its
        store never read: its 503), else none (a team deleted or removed from the
        config since the key named it)."""
        if name is None:
            return None
        team = self._teams.get(name)
        if team is None and self.runtime_teams is not None:
            found = self.runtime_teams.team(name)
            if found is None:
                return None
            team = self._api_teams.get(name)
            if team is None or team.team is not found:  # new, or changed since
                team = self._api_teams[name] = _TeamLimits(found, self.share)
        return team

    def team_limits_now(self, name: str | None) -> KeyLimits | None:
        """The limits of the team ``name`` as requests are charged to them now: the
        config's, else the admin API's (None: no such team now, or its store cannot be
        read)."""
        try:
            team = self._team(name)
        except ProxyError:
            return None
        return None if team is None else team.limits

    def forget_team(self, name: str) -> None:
        """The API team named ``name`` is gone: what was built of it is dropped."""
        self._api_teams.pop(name, None)

    def with_team(self, key: ClientKey, limits: KeyLimits) -> KeyLimits:
        """``limits`` (``key``'s own) with its team's as they are now (an API key names
        a team of the config in force or of the admin API; one no longer there, or
        that cannot be read now: none)."""
        team_limits = self.team_limits_now(key.team)
        return limits if limits.team is team_limits else replace(limits, team=team_limits)

    def ask_limits(self, key: ClientKey, limits: KeyLimits, model: str) -> KeyLimits:
        """What a request of ``key`` for model group ``model`` is checked against and
        charged to: the windows and budgets of the key (``limits``) and of its team that
        count ``model``'s requests, computed once per (key, model) and only for keys with
        a ``models`` filter or a team. The one place a ``models`` filter is applied: the
        limiter never sees one, and a budget over other models costs such a request
        nothing (no reservation, no budget in the limiter's step)."""
        if key.team is None and limits.team is None and not key.model_scoped:
            return limits  # the usual key: its own windows and budgets, every one counting
        team = self._team(key.team)
        cached = self._asks.get((key.name, model))
        if cached is not None and cached[0] is limits and cached[1] is team:
            return cached[2]
        built = for_model(limits, key, model)
        team_limits = None if team is None else team.for_model(model)
        if built.team is not team_limits:
            built = replace(built, team=team_limits)
        self._asks[(key.name, model)] = (limits, team, built)
        return built

    def scoped(self, key: ClientKey) -> bool:
        """Whether a window or a budget of ``key`` or of its team counts some models'
        requests only (its asks differ from one model group to another)."""
        team = self._team(key.team)
        return key.model_scoped or (team is not None and team.scoped)

    def fallback_limits(
        self, key: ClientKey, limits: KeyLimits, asked: str, served: str
    ) -> tuple[KeyLimits, KeyLimits]:
        """When group ``served`` (a fallback) serves a request of ``key`` for ``asked``:
        the windows and budgets of the key and its team that count ``served``'s requests
        and not ``asked``'s (taken before it is tried), and those that count only
        ``asked``'s (given back as for a request that failed there). Neither holds a
        parallel slot: the request holds its own."""
        there = self.ask_limits(key, limits, served)
        here = self.ask_limits(key, limits, asked)
        return _without(there, here), _without(here, there)

    def forget(self, name: str) -> None:
        """The key named ``name`` is gone (an API key revoked or deleted): its limits per
        model group are dropped, not kept until the next reload."""
        for model in self.groups:
            self._asks.pop((name, model), None)

    def carry_over(self, previous: Catalog) -> None:
        """After a reload: what upstreams announced still holds for deployments whose
        config did not change, and the pacing margin measured goes on (the reload's
        ``pacing_margin`` applied to it)."""
        fixed = self.pacing.fixed
        self.pacing = previous.pacing
        self.pacing.set_fixed(fixed, reserved_ahead(self.routing))
        self.announced.pacing = self.pacing
        self.announced.carry_over(
            previous.announced, _deployments(previous.groups), _deployments(self.groups)
        )


def _deployments(groups: Mapping[str, GroupRoute]) -> Iterator[DeploymentRoute]:
    for group in groups.values():
        yield from group.deployments
