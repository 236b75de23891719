"""The configured models, deployments and keys, turned into what the hot path needs.

Built once at start-up (pure): per deployment its limiter ``DeploymentLimits``, upstream
URLs and timeout; per client key its ``KeyLimits``. ``share`` is this process's part of
every budget when budgets are not shared (the in-memory backend under N workers).
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx

from proxy.config import ClientKey, Deployment, ModelGroup, Settings
from proxy.limiter.base import DeploymentLimits, KeyLimits, Rate
from proxy.upstream.client import timeout_extension

__all__ = ["Catalog", "DeploymentRoute", "GroupRoute", "key_limits"]

MINUTE = 60.0
# A deployment's request bucket holds one request unless configured: requests then go
# 60/rpm seconds apart, which no sliding-window upstream limit can reject...
DEFAULT_DEPLOYMENT_BURST = 1
# ...provided they also arrive that far apart: network and event-loop jitter can bring
# two requests a window apart a few milliseconds closer, so deployments are paced 1%
# below their configured limit (0.6 s of slack per minute).
DEPLOYMENT_HEADROOM = 0.01


_ENDPOINTS = ("chat/completions", "completions", "embeddings")


@dataclass(frozen=True, slots=True)
class DeploymentRoute:
    config: Deployment
    group: str
    limits: DeploymentLimits
    upstream_model: str
    # Built once: parsed upstream URLs per endpoint and httpx's timeout extension.
    urls: dict[str, httpx.URL]
    timeouts: dict[str, float]

    @property
    def id(self) -> str:
        return self.config.id

    @property
    def weight(self) -> float:
        return self.config.weight

    def url(self, endpoint: str) -> httpx.URL:
        return self.urls[endpoint]


@dataclass(frozen=True, slots=True)
class GroupRoute:
    name: str
    deployments: tuple[DeploymentRoute, ...]


def _rate(
    limit: int | None, capacity: float | None, share: float, headroom: float = 0.0
) -> Rate | None:
    if limit is None:
        return None
    scaled = limit * share * (1.0 - headroom)
    return Rate(limit=scaled, period=MINUTE, capacity=max(capacity or scaled, 1.0))


def deployment_limits(deployment: Deployment, share: float = 1.0) -> DeploymentLimits:
    burst = deployment.burst or DEFAULT_DEPLOYMENT_BURST
    return DeploymentLimits(
        id=deployment.id,
        # A half-open probe is out at most as long as the call may take.
        probe_timeout=deployment.timeout,
        rpm=_rate(deployment.rpm, burst, share, DEPLOYMENT_HEADROOM),
        # Tokens: a bucket of a whole minute, so any request the upstream could ever
        # accept fits; the request bucket above does the pacing.
        tpm=_rate(deployment.tpm, None, share, DEPLOYMENT_HEADROOM),
    )


def key_limits(key: ClientKey, share: float = 1.0) -> KeyLimits:
    """A key's bucket holds its whole per-minute allowance (50 RPM: 50 at once)."""
    return KeyLimits(
        name=key.name,
        rpm=_rate(key.rpm, None, share),
        tpm=_rate(key.tpm, None, share),
        max_parallel=(
            max(1, int(key.max_parallel * share)) if key.max_parallel is not None else None
        ),
    )


def _group(group: ModelGroup, share: float) -> GroupRoute:
    return GroupRoute(
        name=group.name,
        deployments=tuple(
            DeploymentRoute(
                config=d,
                group=group.name,
                limits=deployment_limits(d, share),
                upstream_model=d.model or group.name,
                urls={e: httpx.URL(f"{d.base_url}/{e}") for e in _ENDPOINTS},
                timeouts=timeout_extension(d.timeout),
            )
            for d in group.deployments
        ),
    )


class Catalog:
    def __init__(self, settings: Settings, share: float = 1.0) -> None:
        self.groups = {g.name: _group(g, share) for g in settings.models}
        self.key_limits = {k.name: key_limits(k, share) for k in settings.keys}
        self.fallbacks = settings.routing.fallbacks
        self.share = share
