"""Fixtures for provider tests: a stand-in cluster and providers built against it.

Every cluster and provider a test makes is stopped/closed here, provider first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest_asyncio

from execd.tokens import derive_token
from sandboxes.providers.base import OwnerRef, SandboxSpec
from sandboxes.providers.kubernetes import KubernetesConfig, KubernetesProvider, build_api_client
from standin import StandinCluster
from standin.tests.conftest import make_cluster  # noqa: F401 - re-exported fixture

NS = "sandboxes"


JOB_KEY = "0123456789abcdef" * 4  # job 7's execd key in these tests


def spec(
    name: str, *, nonce: str | None = None, owner: OwnerRef | None = None, **overrides: Any
) -> SandboxSpec:
    values: dict[str, Any] = {
        "name": name,
        "nonce": nonce or f"nonce-{name}",
        "token": derive_token(JOB_KEY.encode(), name),
        "execd_key": JOB_KEY,
        "job_id": 7,
        "role": "rollout",
        "image": "task/img:1",
        "base_commit": None,
        "cpu_millis": 500,
        "memory_bytes": 2**30,
        "workspace_bytes": None,
        "egress": "deny",
        "key_hash": "k" * 16,
        "owner": owner,
    }
    values.update(overrides)
    return SandboxSpec(**values)


@pytest_asyncio.fixture
async def make_provider(
    make_cluster: Callable[..., StandinCluster],  # noqa: F811 - set up first, torn down last
) -> AsyncIterator[Callable[..., KubernetesProvider]]:
    made: list[KubernetesProvider] = []

    def make(cluster: StandinCluster, **kwargs: Any) -> KubernetesProvider:
        config_values: dict[str, Any] = {
            "namespace": NS,
            "verify_health": False,
            "retry_pending_in_background": False,
            "destroy_attempts": 3,
        }
        for key in list(kwargs):
            if key in KubernetesConfig.__dataclass_fields__:
                config_values[key] = kwargs.pop(key)
        config = KubernetesConfig(**config_values)
        kwargs.setdefault("backoff", lambda attempt: 0.0)
        provider = KubernetesProvider(
            config, api_client=build_api_client(config, host=cluster.url), **kwargs
        )
        made.append(provider)
        return provider

    try:
        yield make
    finally:
        for provider in made:
            await provider.close()
            provider.api_client.close()
