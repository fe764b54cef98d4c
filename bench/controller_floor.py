#!/usr/bin/env python3
"""Benchmark: the floor of a controller's CPU per create on this stack, beside Sandman's own
figure in the same run (issue 13 item 3 asks <= 2 ms of controller CPU per create).

A "floor controller" (this file with ``--child``, a process of its own) does per create only
what ANY controller of this design must, with the parts Sandman must use -- the official
``kubernetes`` client, one pod watch and one Events watch, psycopg 3 -- and nothing else:
no pool, no pacer object, no state machine, no events, no dashboards, no retries.

* ``post-serial``: the N POSTs alone (below), one after another on the main thread, no
  watch, no pacing: the client's own cost of a create.
* ``client``: N creates paced at R/s (a sleep schedule on the main thread) on a pool of 8
  threads (the size of Sandman's Kubernetes executor), each POSTing Sandman's own pod body
  (the provider's manifest for one spec, built once as JSON text; each pod's name written
  into the text) through the client's request machinery (Sandman's ``post_pod``:
  ``param_serialize`` + ``call_api``, the response read raw); one pod watch and one Events
  watch (``_preload_content=False``), each a thread that decodes every line with Sandman's
  decoder (``fastjson.loads``: orjson when installed); a pod counts when the watch shows its
  Ready condition True. No database.
* ``client+db``: the same plus the least a controller that survives a restart must write:
  each pod's row INSERTed and committed before its POST (ownership before the create), and
  UPDATEd when it is Ready. One writer thread with group commit (every write queued while a
  transaction runs goes in the next: one ``INSERT ... SELECT FROM UNNEST`` and one
  ``UPDATE ... WHERE name = ANY``), psycopg on an autocommit connection, server-side
  binding, PostgreSQL (``DATABASE_URL``; the variant is skipped without it).
* ``sandman``: ``bench/scale_ramp.py --steps N --rate R --hold-s 0`` (the controller and a
  driver firing N acquires, the same measurement as ``cpu_per_create.py``).

``--pin``: each stand-in on the machine's last CPU and each controller on the others
(``k8s_burst.pin_apart``; PostgreSQL and the caches still shared), for an API server on
another host as far as this machine allows.

The three alternate ``--rounds`` times, each started on a settled host (``hostquiet``) with a
fresh stand-in process (``manage.py standin_cluster``, realtime, speed 1, ``--nodes``).
CPU: ``time.process_time()`` of the measuring process from the first create until every pod
is Ready, / N, and by thread from /proc; the stand-in's and PostgreSQL's CPU are not in it.

Results: ``bench/results/controller_floor.json`` (``--out``).
Usage: ``python scripts/with_postgres.py -- python bench/controller_floor.py [--steps 600]
[--rate 50] [--nodes 150] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT))
import baseline_tree  # noqa: E402
import hostquiet  # noqa: E402
from cpu_per_create import run_once as sandman_run  # noqa: E402

RESULTS = ROOT / "bench" / "results"
JOB_ID = 1
NAME_MARK = "floorzq000000"  # each pod's name: the same length, written over this
CREATE_THREADS = 8  # Sandman's Kubernetes executor (``ApiCalls``)
VARIANTS = ("post-serial", "client", "client+db")


# --- the floor controller (``--child``) ---------------------------------------------------


class Writer:
    """One thread, one autocommit connection, group commit: every write queued while a
    transaction runs goes in the next one."""

    def __init__(self, dsn: str) -> None:
        import psycopg

        self._dsn = dsn
        self._conn = psycopg.connect(dsn, autocommit=True)
        self._conn.execute(
            "CREATE TABLE IF NOT EXISTS floor_sandbox (id bigserial PRIMARY KEY,"
            " name text NOT NULL UNIQUE, state text NOT NULL, requested_at timestamptz,"
            " ready_at timestamptz)"
        )
        self._conn.execute("TRUNCATE floor_sandbox")
        self._queue: queue.SimpleQueue[tuple[str, str, threading.Event | None] | None] = (
            queue.SimpleQueue()
        )
        self.batches = 0
        self._thread = threading.Thread(target=self._run, name="floor-db", daemon=True)
        self._thread.start()

    def insert(self, name: str) -> None:
        """The row, committed, before the create goes out."""
        done = threading.Event()
        self._queue.put(("insert", name, done))
        done.wait()

    def ready(self, name: str) -> None:
        self._queue.put(("ready", name, None))

    def _run(self) -> None:
        while (first := self._queue.get()) is not None:
            batch = [first]
            while True:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            inserts = [name for kind, name, _ in batch if kind == "insert"]
            ready = [name for kind, name, _ in batch if kind == "ready"]
            with self._conn.transaction():
                if inserts:
                    self._conn.execute(
                        "INSERT INTO floor_sandbox (name, state, requested_at)"
                        " SELECT n, 'creating', now() FROM UNNEST(%s::text[]) AS n",
                        [inserts],
                    )
                if ready:
                    self._conn.execute(
                        "UPDATE floor_sandbox SET state = 'ready', ready_at = now()"
                        " WHERE name = ANY(%s)",
                        [ready],
                    )
            self.batches += 1
            for _, _, done in batch:
                if done is not None:
                    done.set()

    def count(self, state: str) -> int:
        """Rows in ``state`` (after :meth:`close`: every queued write is in)."""
        import psycopg

        with psycopg.connect(self._dsn) as conn:
            row = conn.execute("SELECT count(*) FROM floor_sandbox WHERE state = %s", [state])
            return int(row.fetchone()[0])  # type: ignore[index]

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._conn.close()


def _watch(call: Any, on_object: Any, synced: threading.Event) -> None:
    """List, then watch from the list's version, decoding every line (a watch that ends
    is watched again from its last version)."""
    from kubernetes import watch

    from sandboxes.providers.kubernetes.fastjson import loads

    listed = call(_preload_content=False)
    data = loads(listed.data)
    version = data["metadata"]["resourceVersion"]
    for obj in data.get("items") or ():
        on_object(obj)
    synced.set()
    while True:
        resp = call(
            watch=True, resource_version=version, allow_watch_bookmarks=True,
            timeout_seconds=600, _preload_content=False,
        )  # fmt: skip
        for line in watch.watch.iter_resp_lines(resp):
            if not line.strip():
                continue
            event = loads(line)
            obj = event.get("object") or {}
            version = (obj.get("metadata") or {}).get("resourceVersion") or version
            if event.get("type") in ("ADDED", "MODIFIED"):
                on_object(obj)
        resp.release_conn()


def child(args: argparse.Namespace) -> None:
    from kubernetes import client
    from kubernetes import config as kconfig
    from scale_ramp import thread_cpu_s

    from sandboxes import labels as L
    from sandboxes.providers.kubernetes.podbody import post_pod

    spec = json.loads(Path(args.spec).read_text())
    namespace, template, n, rate = spec["namespace"], spec["body"], args.steps, args.rate
    api = kconfig.new_client_from_config(config_file=spec["kubeconfig"])
    core = client.CoreV1Api(api)
    core.create_namespaced_secret(
        namespace,
        {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": spec["secret"]},
         "stringData": {spec["secret_key"]: "k" * 64}},
    )  # fmt: skip
    writer = Writer(os.environ["DATABASE_URL"]) if args.child == "client+db" else None

    ready: set[str] = set()
    all_ready = threading.Event()

    def on_pod(obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        if name in ready:
            return
        conditions = (obj.get("status") or {}).get("conditions") or ()
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            ready.add(name)
            if writer is not None:
                writer.ready(name)
            if len(ready) >= n:
                all_ready.set()

    events_seen = [0]

    def on_event(obj: dict[str, Any]) -> None:
        events_seen[0] += 1

    selector = f"{L.MANAGED_BY}={L.VALUE_MANAGED_BY}"
    watches = () if args.child == "post-serial" else (
        ("floor-pod-watch", lambda **kw: core.list_namespaced_pod(
            namespace, label_selector=selector, **kw), on_pod),
        ("floor-event-watch", lambda **kw: core.list_namespaced_event(
            namespace, field_selector="involvedObject.kind=Pod", **kw), on_event),
    )  # fmt: skip
    for name, call, on_object in watches:
        synced = threading.Event()
        threading.Thread(
            target=_watch, args=(call, on_object, synced), name=name, daemon=True
        ).start()
        synced.wait(60)

    def create(i: int) -> None:
        name = f"{NAME_MARK[:-6]}{i:06d}"
        if writer is not None:
            writer.insert(name)
        body = json.loads(template.replace(NAME_MARK, name))
        resp = post_pod(core, namespace, body, request_timeout=60.0)
        resp.read()
        resp.release_conn()

    pool = concurrent.futures.ThreadPoolExecutor(
        args.create_threads, thread_name_prefix="floor-k8s"
    )
    load = os.getloadavg()
    threads0, cpu0, wall0 = thread_cpu_s(), time.process_time(), time.monotonic()
    if args.child == "post-serial":  # the POSTs alone, one after another, no watch
        for i in range(n):
            create(i)
        finished = None
    else:
        futures = []
        for i in range(n):
            delay = wall0 + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # the pacing schedule, not a synchronisation
            futures.append(pool.submit(create, i))
        for future in futures:
            future.result()
        finished = all_ready.wait(args.budget_s)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    threads = thread_cpu_s()
    by_thread = {k: round(v - threads0.get(k, 0.0), 2) for k, v in threads.items()}
    out = {
        "variant": args.child,
        "create_threads": args.create_threads,
        "loadavg_at_start": [round(x, 2) for x in load],
        "requested": n,
        "ready": len(ready) if watches else None,  # post-serial: not watched
        "all_ready": finished,
        "burst_wall_s": round(wall, 2),
        "cpu_s": round(cpu, 3),
        "cpu_ms_per_create": round(cpu * 1000 / n, 3),
        "cpu_s_by_thread": {k: v for k, v in sorted(by_thread.items()) if v > 0},
        "pod_body_bytes": len(template),
        "events_decoded": events_seen[0],
    }
    if writer is not None:
        out["write_batches"] = writer.batches
        writer.close()
        out["rows_ready"] = writer.count("ready")
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # the watch threads are daemons on open streams


# --- the parent: a stand-in per run, the body, the alternation -----------------------------


def pod_body(standin: Any) -> dict[str, Any]:
    """Sandman's own manifest for one spec of the ramp's size, as JSON text with a name
    mark, and what the child needs to send it."""
    from kubernetes import client
    from scale_ramp import IMAGE, SPEC

    from sandboxes.providers.base import SandboxSpec
    from sandboxes.providers.kubernetes.jobsecrets import SECRET_KEY, secret_name
    from sandboxes.providers.kubernetes.manifest import build_pod_manifest

    config = standin.provider_config()
    spec = SandboxSpec(
        name=NAME_MARK, nonce="n" * 32, token="t" * 64, job_id=JOB_ID, role="rollout",
        image=IMAGE, base_commit=None, egress="deny", key_hash="h" * 16, execd_key="k" * 64,
        **SPEC,
    )  # fmt: skip
    body = client.ApiClient().sanitize_for_serialization(build_pod_manifest(spec, config))
    return {
        "namespace": config.namespace,
        "kubeconfig": str(standin.kubeconfig),
        "body": json.dumps(body),
        "secret": secret_name(JOB_ID),
        "secret_key": SECRET_KEY,
    }


def floor_run(variant: str, tmp: Path, args: argparse.Namespace) -> dict[str, Any]:
    from k8s_burst import StandinProcess

    quiet = hostquiet.settle()
    standin = StandinProcess(tmp, nodes=args.nodes, speed=1.0, seed=7)
    try:
        spec = tmp / f"spec-{time.monotonic_ns()}.json"
        spec.write_text(json.dumps(pod_body(standin)))
        standin_cpu0 = standin.cpu_seconds()
        done = subprocess.run(
            [sys.executable, __file__, "--child", variant, "--spec", str(spec),
             "--steps", str(args.steps), "--rate", str(args.rate),
             "--budget-s", str(args.budget_s), "--create-threads", str(args.create_threads)],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        if done.returncode:
            raise RuntimeError(f"the {variant} floor failed:\n{done.stderr[-3000:]}")
        out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        out["standin_cpu_s"] = round(standin.cpu_seconds() - standin_cpu0, 2)
        out["pinned"] = standin.pinned
    finally:
        standin.stop()
    return {"tree": variant, "host_before_run": quiet} | out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--nodes", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--budget-s", type=float, default=300.0)
    parser.add_argument(
        "--create-threads", type=int, default=CREATE_THREADS, help="the floor's create pool"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "controller_floor.json")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="each stand-in on the last CPU, each controller on the others (k8s_burst.pin_apart)",
    )
    parser.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--spec", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    from k8s_burst import PIN_ENV, setup_django

    if args.pin:
        os.environ[PIN_ENV] = "1"  # read by every StandinProcess, here and in scale_ramp.py

    postgres = os.environ.get("DATABASE_URL", "").startswith(("postgres://", "postgresql://"))
    variants = [v for v in VARIANTS if postgres or v != "client+db"]
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="sandman-floor-") as tmp:
        setup_django(Path(tmp))
        for _ in range(args.rounds):
            for variant in variants:
                runs.append(floor_run(variant, Path(tmp), args))
            runs.append(sandman_run(ROOT, Path(tmp), "sandman", args))
    summary: dict[str, Any] = {}
    for tag in [*variants, "sandman"]:
        key = "controller_cpu_ms_per_create" if tag == "sandman" else "cpu_ms_per_create"
        values = [r[key] for r in runs if r["tree"] == tag]
        summary[tag] = {"runs": len(values), "median_ms_per_create": statistics.median(values),
                        "min": min(values), "max": max(values)}  # fmt: skip
    baseline_tree.write_cpu_per_create(
        args.out,
        benchmark="controller_floor",
        what=f"CPU per create over one burst of {args.steps} creates paced at {args.rate}/s:"
        f" a floor controller (the client alone; the client and the least durable record)"
        f" beside Sandman's controller ({baseline_tree.head()}), alternating",
        server="none (each controller in its own process, no HTTP front); stand-in out of"
        " process, a fresh one per run",
        settings=baseline_tree.in_process_settings() | {"pinned_apart": args.pin},
        summary=summary,
        runs=runs,
    )


if __name__ == "__main__":
    main()
