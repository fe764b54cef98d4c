"""A kubeconfig that points the official client (or kubectl) at a stand-in cluster.

Plain HTTP, no credentials: the stand-in listens on loopback only and checks nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml


def kubeconfig_dict(
    server: str, *, namespace: str = "default", name: str = "standin"
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server}}],
        "users": [{"name": name, "user": {}}],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": namespace}}
        ],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(
    path: str | os.PathLike[str], server: str, *, namespace: str = "default"
) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(target.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(kubeconfig_dict(server, namespace=namespace), sort_keys=False))
    tmp.replace(target)
    return target
