"""How the stand-in's kubelet turns a pod's spec into the processes it runs (pure).

A kubelet starts each container from its spec alone, and so does this module: the
container's ``env`` (literal values, and ``valueFrom.fieldRef`` from the downward API:
``metadata.name``, ``metadata.namespace``, ``metadata.uid``, ``spec.nodeName``,
``status.podIP``, ``status.hostIP``, ``metadata.labels['k']`` / ``annotations['k']``), then
``$(VAR)`` references in env values, ``command`` and ``args`` expanded from the variables
defined before them (an unresolved reference stays as written; ``$$(VAR)`` is the escape
for a literal ``$(VAR)``), then the pod's volumes materialised (``emptyDir`` as an empty
directory; ``secret`` as one file per key, mode ``defaultMode``/``items[].mode``, default
0644) and mounted where the container's ``volumeMounts`` say.

There are no mount namespaces here, so a "mount" is a host directory standing for the
container path: every mounted path (and each path the stand-in's images provide, see
:class:`ImageModel`) is rewritten to its host directory in the expanded command, args and
env values. That rewriting is the ONLY liberty taken; nothing here knows what the pod runs.

Invariant: a container is started from what its pod object says -- never from stand-in
annotations -- so a pod spec that would not work on a kubelet does not work here either.
"""

from __future__ import annotations

import base64
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Obj = Mapping[str, Any]
_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")
_FIELD_KEYED = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


class ContainerConfigError(ValueError):
    """The spec cannot be run as written (a kubelet reports CreateContainerConfigError)."""


def expand(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion: defined references replaced, ``$$`` -> ``$``.

    Kubernetes API reference, Container v1 (``args``, ``command``, ``env.value``):
    "Variable references $(VAR_NAME) are expanded using the container's environment. If a
    variable cannot be resolved, the reference in the input string will be unchanged.
    Double $$ are reduced to a single $, which allows for escaping the $(VAR_NAME) syntax".
    """

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env[name] if name in env else match.group(0)

    return _REF.sub(one, text)


def field_ref(pod: Obj, path: str) -> str:
    """One downward-API ``fieldRef.fieldPath`` of ``pod`` (Kubernetes "Expose Pod
    Information to Containers Through Environment Variables")."""
    meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": meta.get("namespace"),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName"),
        "status.podIP": status.get("podIP"),
        "status.hostIP": status.get("hostIP"),
    }
    if path in simple:
        return str(simple[path] or "")
    keyed = _FIELD_KEYED.match(path)
    if keyed is not None:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise ContainerConfigError(f"unsupported fieldRef.fieldPath {path!r}")


def container_env(
    pod: Obj, container: Obj, secrets: Callable[[str], Mapping[str, str] | None]
) -> dict[str, str]:
    """The container's variables in order, each expanded from the ones before it."""
    env: dict[str, str] = {}
    for entry in container.get("env") or []:
        name = entry.get("name") or ""
        source = entry.get("valueFrom")
        if source is None:
            env[name] = expand(str(entry.get("value") or ""), env)
        elif "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"].get("fieldPath", ""))
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            data = secrets(ref.get("name", ""))
            if data is None or ref.get("key") not in data:
                raise ContainerConfigError(f'secret "{ref.get("name")}" not found')
            env[name] = base64.b64decode(data[ref["key"]]).decode()
        else:
            raise ContainerConfigError(f"unsupported valueFrom for {name!r}")
    return env


@dataclass(frozen=True)
class ImageModel:
    """The files the stand-in's images hold, as host directories per container path.

    ``provides`` maps an image name (or ``"*"`` for every image) to ``{container path: host
    path}``; a host path of ``None`` stands for an empty directory of the image (a WORKDIR).
    """

    provides: Mapping[str, Mapping[str, Path | None]] = field(default_factory=dict)

    def paths(self, image: str) -> dict[str, Path | None]:
        found: dict[str, Path | None] = dict(self.provides.get("*", {}))
        for pattern, paths in self.provides.items():
            if pattern != "*" and pattern in image:
                found.update(paths)
        return found


@dataclass(frozen=True)
class Launch:
    """One container process: argv and env as the runtime gets them, after expansion."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def materialise_volumes(
    pod: Obj, directory: Path, secrets: Callable[[str], Mapping[str, str] | None]
) -> dict[str, Path]:
    """Each pod volume as a host directory under ``directory``: volume name -> path."""
    made: dict[str, Path] = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = volume.get("name") or ""
        path = directory / "volumes" / name
        path.mkdir(parents=True, exist_ok=True)
        if "emptyDir" in volume:
            path.chmod(0o777)  # an emptyDir is world-writable, as the kubelet creates it
        elif "secret" in volume:
            _write_secret(volume["secret"], path, secrets)
        else:
            raise ContainerConfigError(f"volume {name!r}: only emptyDir and secret are run")
        made[name] = path
    return made


def _write_secret(
    source: Obj, path: Path, secrets: Callable[[str], Mapping[str, str] | None]
) -> None:
    data = secrets(source.get("secretName") or "")
    if data is None:
        raise ContainerConfigError(f'secret "{source.get("secretName")}" not found')
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items") or [{"key": k, "path": k} for k in data]
    for item in items:
        if item["key"] not in data:
            raise ContainerConfigError(f"secret key {item['key']!r} not found")
        target = path / item["path"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(base64.b64decode(data[item["key"]]))
        target.chmod(int(item.get("mode", mode)))
    path.chmod(0o755)  # the kubelet's secret volume directory: listable, files by their mode


def container_launch(
    pod: Obj,
    container: Obj,
    *,
    volumes: Mapping[str, Path],
    images: ImageModel,
    directory: Path,
    base_env: Mapping[str, str],
    secrets: Callable[[str], Mapping[str, str] | None],
) -> Launch | None:
    """The process for ``container``, or None when it has no command (nothing to run)."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    if not argv:
        return None
    env = container_env(pod, container, secrets)
    argv = [expand(a, env) for a in argv]
    mounts: dict[str, Path] = {}
    for cpath, host in images.paths(str(container.get("image") or "")).items():
        if host is None:
            host = directory / "image" / str(container.get("name")) / cpath.strip("/")
            host.mkdir(parents=True, exist_ok=True)
        mounts[cpath] = host
    for mount in container.get("volumeMounts") or []:
        host = volumes.get(mount.get("name") or "")
        if host is None:
            raise ContainerConfigError(f"volumeMount {mount.get('name')!r} names no volume")
        mounts[mount["mountPath"]] = host
    rewrite = _rewriter(mounts)
    full_env = {**base_env, **{k: rewrite(v) for k, v in env.items()}}
    workdir = container.get("workingDir")
    cwd = Path(rewrite(workdir)) if workdir else directory
    return Launch(str(container.get("name")), [rewrite(a) for a in argv], full_env, cwd)


def _rewriter(mounts: Mapping[str, Path]) -> Callable[[str], str]:
    """Replace each container path (at a path boundary) by its host directory."""
    if not mounts:
        return lambda text: text
    ordered = sorted(mounts, key=len, reverse=True)
    pattern = re.compile(
        r"(?<![\w./-])(" + "|".join(re.escape(p.rstrip("/")) for p in ordered) + r")(?![\w.-])"
    )
    table = {p.rstrip("/"): str(mounts[p]) for p in ordered}
    return lambda text: pattern.sub(lambda m: table[m.group(1)], text)


def default_path_env(bin_dir: Path) -> dict[str, str]:
    """The image's environment: a PATH (``bin_dir`` first: the runtime's python3) and HOME."""
    std = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    env = {"PATH": f"{bin_dir}:{std}", "HOME": os.environ.get("HOME", "/root")}
    for name in ("LANG", "LC_ALL"):
        if name in os.environ:
            env[name] = os.environ[name]
    return env
