"""Byte-exact file routes (paper Tables A23-A24): read_bytes returns the exact
bytes; the text read returns an exact window plus the whole file's size and
SHA-256, and refuses what it cannot represent; write is atomic, keeps the
mode and refuses a stale edit."""

import base64
import hashlib
import os
import stat

import pytest

from execd.tests.helpers import Client, Execd

pytestmark = pytest.mark.timeout(60)

CASES = {
    "lf.py": b"import os\nprint(os.sep)\n",
    "crlf.txt": b"one\r\ntwo\r\nthree\r\n",
    "bom.py": b"\xef\xbb\xbfprint('bom')\n",
    "no_final_newline.txt": b"first\nlast line",
    "invalid.bin": b"ok\n\xff\xfe broken \xc3\x28\n",
    "mixed.txt": b"a\r\nb\nc\r\n",
    "bare_cr.txt": b"left\rright\nnext\n",
    "empty.txt": b"",
}


@pytest.fixture
def files(execd: Execd):
    for name, data in CASES.items():
        with open(os.path.join(execd.workspace, name), "wb") as f:
            f.write(data)
    return CASES


@pytest.mark.parametrize("name", sorted(CASES))
def test_read_bytes_is_exact_with_size_and_sha256(client: Client, files, name: str) -> None:
    data = files[name]
    res = client.post("/files/read_bytes", {"path": name})
    assert base64.b64decode(res["content_b64"]) == data
    assert res["size"] == len(data) and res["sha256"] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "name, endings, bare_cr, bom",
    [
        ("lf.py", "lf", False, False),
        ("crlf.txt", "crlf", False, False),
        ("bom.py", "lf", False, True),
        ("no_final_newline.txt", "lf", False, False),
        ("mixed.txt", "mixed", False, False),
        ("bare_cr.txt", "lf", True, False),
        ("empty.txt", "none", False, False),
    ],
)
def test_text_read_of_the_whole_file_is_exact(
    client: Client, files, name: str, endings: str, bare_cr: bool, bom: bool
) -> None:
    data = files[name]
    res = client.post("/files/read", {"path": name})
    assert res["content"].encode("utf-8") == data
    assert res["complete"] is True
    assert res["size"] == len(data) and res["sha256"] == hashlib.sha256(data).hexdigest()
    assert (res["line_endings"], res["bare_cr"], res["bom"]) == (endings, bare_cr, bom)


def test_text_read_refuses_invalid_utf8_and_points_to_read_bytes(client: Client, files) -> None:
    status, body = client.request("POST", "/files/read", {"path": "invalid.bin"})
    assert status == 422 and body["error"] == "not_utf8"
    assert "/files/read_bytes" in body["detail"] and body["use"] == "/files/read_bytes"


def test_a_window_keeps_its_line_endings_and_reports_the_whole_file(
    client: Client, execd: Execd
) -> None:
    """Table A23: a window past line 2,000 of a long CRLF file."""
    lines = [("line %d\r\n" % i).encode() for i in range(1, 5001)]
    data = b"".join(lines) + b"tail without newline"
    with open(os.path.join(execd.workspace, "long.txt"), "wb") as f:
        f.write(data)
    res = client.post("/files/read", {"path": "long.txt", "start_line": 2500, "max_lines": 3})
    assert res["content"] == "line 2500\r\nline 2501\r\nline 2502\r\n"
    assert (res["start_line"], res["end_line"], res["total_lines"]) == (2500, 2502, 5001)
    assert res["complete"] is False
    assert res["size"] == len(data) and res["sha256"] == hashlib.sha256(data).hexdigest()
    last = client.post("/files/read", {"path": "long.txt", "start_line": 5000})
    assert last["content"] == "line 5000\r\ntail without newline"
    whole = client.post("/files/read", {"path": "long.txt"})
    assert whole["content"].encode() == data and whole["complete"] is True


@pytest.mark.parametrize("name", sorted(CASES))
def test_read_bytes_then_write_back_is_identical(
    client: Client, execd: Execd, files, name: str
) -> None:
    before = client.post("/files/read_bytes", {"path": name})
    written = client.post(
        "/files/write",
        {"path": name, "content_b64": before["content_b64"], "expected_sha256": before["sha256"]},
    )
    assert written["sha256"] == before["sha256"] and written["size"] == before["size"]
    with open(os.path.join(execd.workspace, name), "rb") as f:
        assert f.read() == files[name]


def test_text_write_is_byte_exact_and_atomic(client: Client, execd: Execd) -> None:
    path = os.path.join(execd.workspace, "edit.txt")
    with open(path, "wb") as f:
        f.write(b"old\r\n")
    holder = open(path, "rb")  # a reader of the old file keeps the old inode
    text = "\ufeffnew\r\nline\rwith bare CR\nno newline at end"
    res = client.post("/files/write", {"path": "edit.txt", "content": text})
    assert res["sha256"] == hashlib.sha256(text.encode()).hexdigest()
    with open(path, "rb") as f:
        assert f.read() == text.encode()
    assert holder.read() == b"old\r\n"
    holder.close()
    assert [n for n in os.listdir(execd.workspace) if "execd-tmp" in n] == []


def test_write_keeps_the_existing_mode_or_applies_the_given_one(
    client: Client, execd: Execd
) -> None:
    path = os.path.join(execd.workspace, "run.sh")
    with open(path, "w") as f:
        f.write("#!/bin/sh\n")
    os.chmod(path, 0o751)
    client.post("/files/write", {"path": "run.sh", "content": "#!/bin/sh\necho hi\n"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o751
    client.post("/files/write", {"path": "run.sh", "content": "x\n", "mode": "0600"})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_write_refuses_a_stale_edit_with_409_and_leaves_the_file(
    client: Client, execd: Execd
) -> None:
    path = os.path.join(execd.workspace, "shared.txt")
    with open(path, "w") as f:
        f.write("v1\n")
    read = client.post("/files/read", {"path": "shared.txt"})
    client.exec("echo v2 > shared.txt")  # someone changed it since
    status, body = client.request(
        "POST",
        "/files/write",
        {"path": "shared.txt", "content": "v1 edited\n", "expected_sha256": read["sha256"]},
    )
    assert status == 409 and body["error"] == "sha_mismatch"
    assert body["current_sha256"] == hashlib.sha256(b"v2\n").hexdigest()
    with open(path) as f:
        assert f.read() == "v2\n"


def test_write_goes_through_a_symlink_and_can_create_parents(client: Client, execd: Execd) -> None:
    ws = execd.workspace
    with open(os.path.join(ws, "target.txt"), "w") as f:
        f.write("t\n")
    os.symlink("target.txt", os.path.join(ws, "link.txt"))
    client.post("/files/write", {"path": "link.txt", "content": "through\n"})
    assert os.path.islink(os.path.join(ws, "link.txt"))
    with open(os.path.join(ws, "target.txt")) as f:
        assert f.read() == "through\n"
    status, body = client.request("POST", "/files/write", {"path": "a/b/c.txt", "content": "x"})
    assert status == 404 and body["error"] == "no_parent"
    client.post("/files/write", {"path": "a/b/c.txt", "content": "x", "make_parents": True})
    assert os.path.isfile(os.path.join(ws, "a", "b", "c.txt"))


@pytest.mark.parametrize(
    "route, body, status, code",
    [
        ("/files/read", {"path": "missing.txt"}, 404, "not_found"),
        ("/files/read_bytes", {"path": "missing.txt"}, 404, "not_found"),
        ("/files/read", {"path": "adir"}, 400, "is_a_directory"),
        ("/files/read_bytes", {"path": "adir"}, 400, "is_a_directory"),
        ("/files/write", {"path": "adir", "content": "x"}, 400, "is_a_directory"),
        ("/files/read", {"path": "lf.py", "start_line": 0}, 400, "bad_value"),
        ("/files/read", {"path": "lf.py", "max_lines": "3"}, 400, "bad_type"),
        ("/files/read", {}, 400, "missing_field"),
        ("/files/write", {"path": "x.txt"}, 400, "bad_request"),
        (
            "/files/write",
            {"path": "x.txt", "content": "a", "content_b64": "YQ=="},
            400,
            "bad_request",
        ),
        ("/files/write", {"path": "x.txt", "content_b64": "not base64!"}, 400, "bad_value"),
        (
            "/files/write",
            {"path": "x.txt", "content": "a", "expected_sha256": "abc"},
            400,
            "bad_value",
        ),
        ("/files/write", {"path": "x.txt", "content": "a", "mode": "rwx"}, 400, "bad_value"),
        ("/files/write", {"path": "x.txt", "content": "\ud800"}, 400, "bad_value"),
    ],
)
def test_bad_file_requests_get_a_clear_4xx_and_change_nothing(
    client: Client, execd: Execd, files, route: str, body, status: int, code: str
) -> None:
    os.makedirs(os.path.join(execd.workspace, "adir"), exist_ok=True)
    before = sorted(os.listdir(execd.workspace))
    got, answer = client.request("POST", route, body)
    assert (got, answer["error"]) == (status, code), answer
    assert answer["detail"]
    assert sorted(os.listdir(execd.workspace)) == before
