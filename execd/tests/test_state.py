"""Checked reuse (paper Appendix I, Table A34): a baseline, a poisoned tenant,
a check that lists every change, a restore that undoes the exact ones and
reports the rest."""

import subprocess

import pytest

from execd.tests.helpers import is_running, read_pids

pytestmark = pytest.mark.timeout(90)

GIT = [
    "git",
    "-c",
    "user.name=t",
    "-c",
    "user.email=t@example.com",
    "-c",
    "init.defaultBranch=main",
]


@pytest.fixture
def sandbox(start_execd, tmp_path):
    """A git workspace plus a fake system: etc, home, tmp and a site-packages dir."""
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "app.py").write_text("def answer():\n    return 42\n")
    (repo / ".gitignore").write_text("build/\n")
    (repo / "build").mkdir()
    (repo / "build" / "artifact.o").write_bytes(b"\0\1\2")
    subprocess.run(GIT + ["init", "-q"], cwd=str(repo), check=True)
    subprocess.run(GIT + ["add", "-A"], cwd=str(repo), check=True)
    subprocess.run(GIT + ["commit", "-qm", "base"], cwd=str(repo), check=True)
    root = tmp_path / "system"
    for d in (
        "etc",
        "home/user",
        "tmp",
        "lib/site-packages/pkg-1.0.dist-info",
        "lib/site-packages/pkg",
    ):
        (root / d).mkdir(parents=True)
    (root / "etc" / "app.conf").write_text("mode = safe\n" * 10)
    (root / "home" / "user" / ".bashrc").write_text("alias ll='ls -l'\n")
    site = root / "lib" / "site-packages"
    (site / "pkg-1.0.dist-info" / "METADATA").write_text("Name: pkg\nVersion: 1.0\n")
    (site / "pkg" / "__init__.py").write_text("")
    (site / "pkg.pth").write_text("/opt/pkg\n")

    def start(*extra: str):
        d = start_execd(
            "--state-roots",
            ",".join(str(root / r) for r in ("etc", "home", "tmp")),
            "--site-packages",
            str(site),
            *extra,
            workspace=str(repo),
        )
        return d, d.client(), repo, root, site

    return start


def _kinds(diffs):
    return sorted(
        (
            d["kind"],
            d["change"],
            d.get("path") or d.get("ref") or d.get("name") or d.get("repo") or d.get("cmdline"),
        )
        for d in diffs
    )


def test_a_poisoned_tenant_is_found_and_fully_restored(sandbox, tmp_path) -> None:
    d, c, repo, root, site = sandbox()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=str(repo), capture_output=True, text=True
    ).stdout.strip()
    base = c.post("/state/baseline")
    assert base["repos"] == [str(repo)] and base["site_packages"] == [str(site)]
    assert base["restorable_files"] > 0
    first = c.post("/state/check")
    assert (first["clean"], first["differences"]) == (True, [])

    pidfile = tmp_path / "stray.pid"
    poison = c.exec(
        'echo \'import os; os.environ["POISONED"] = "1"\' > %(site)s/sitecustomize.py\n'
        "echo /evil > %(site)s/evil.pth\n"
        "echo 'Version: 6.6.6' >> %(site)s/pkg-1.0.dist-info/METADATA\n"
        "printf '    # tenant edit\\n' >> app.py\n"
        "git -c user.name=x -c user.email=x@x commit -qam poison\n"
        "echo 'mode = open' > %(root)s/etc/app.conf\n"
        "mkdir -p %(root)s/tmp/cache/deep && echo x > %(root)s/tmp/cache/deep/f\n"
        "rm %(root)s/home/user/.bashrc\n"
        "export POISON=1\n"
        "setsid -f sh -c 'echo $$ > %(pid)s; exec sleep 300'\n"
        "while [ ! -s %(pid)s ]; do :; done" % {"site": site, "root": root, "pid": pidfile}
    )
    assert poison["exit_code"] == 0, poison
    (stray,) = read_pids(pidfile)

    check = c.post("/state/check")
    assert check["clean"] is False
    found = _kinds(check["differences"])
    for expected in [
        ("file", "added", str(site / "sitecustomize.py")),
        ("file", "added", str(site / "evil.pth")),
        ("file", "modified", str(site / "pkg-1.0.dist-info" / "METADATA")),
        ("file", "modified", str(repo / "app.py")),
        ("file", "modified", str(root / "etc" / "app.conf")),
        ("file", "added", str(root / "tmp" / "cache")),
        ("file", "removed", str(root / "home" / "user" / ".bashrc")),
        ("git_ref", "moved", "refs/heads/main"),
        ("git_head", "moved", str(repo)),
        ("git_index", "modified", str(repo)),
        ("env", "added", "POISON"),
    ]:
        assert expected in found, (expected, found)
    categories = {x["path"]: x["category"] for x in check["differences"] if x["kind"] == "file"}
    assert categories[str(site / "sitecustomize.py")] == "sitecustomize"
    assert categories[str(site / "evil.pth")] == "pth"
    assert categories[str(repo / "app.py")] == "tracked"
    procs = [x for x in check["differences"] if x["kind"] == "process"]
    assert [(p["change"], p["pid"]) for p in procs] == [("added", stray)]

    restored = c.post("/state/restore")
    assert restored["unrestorable"] == [] and restored["clean"] is True, restored
    assert c.post("/state/check")["clean"] is True
    assert not (site / "sitecustomize.py").exists() and not (root / "tmp" / "cache").exists()
    assert (repo / "app.py").read_text() == "def answer():\n    return 42\n"
    assert (root / "home" / "user" / ".bashrc").read_text() == "alias ll='ls -l'\n"
    assert (
        subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=str(repo), capture_output=True, text=True
        ).stdout.strip()
        == head
    )
    assert (
        subprocess.run(
            ["git", "status", "--porcelain"], cwd=str(repo), capture_output=True, text=True
        ).stdout
        == ""
    )
    assert not is_running(stray)
    assert c.exec("echo ${POISON:-none}")["output"] == "none\n"


def test_a_change_without_stored_baseline_bytes_is_reported_unrestorable(sandbox) -> None:
    d, c, repo, root, site = sandbox("--state-max-copy-bytes", "64")
    c.post("/state/baseline")
    c.exec("echo 'mode = open' > %s/etc/app.conf; echo small > %s/tmp/new.txt" % (root, root))
    result = c.post("/state/restore")
    assert result["clean"] is False
    [bad] = result["unrestorable"]
    assert bad["path"] == str(root / "etc" / "app.conf") and bad["change"] == "modified"
    assert "not stored" in bad["reason"]
    assert [r["path"] for r in result["restored"]] == [str(root / "tmp" / "new.txt")]
    assert _kinds(result["remaining"]) == [("file", "modified", str(root / "etc" / "app.conf"))]


def test_check_before_a_baseline_is_a_409(sandbox) -> None:
    d, c, *_ = sandbox()
    status, body = c.request("POST", "/state/check", {})
    assert status == 409 and body["error"] == "no_baseline"


def test_state_request_fields_are_validated(sandbox) -> None:
    d, c, *_ = sandbox()
    status, body = c.request("POST", "/state/baseline", {"roots": "/etc"})
    assert status == 400 and body["error"] == "bad_type"
