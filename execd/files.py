"""Byte-exact file routes: read (text window), read_bytes, write (Tables A23-A24).

Choices, so an editor can round-trip any file it is given:
- ``read`` returns ``content`` as the exact text of the requested lines,
  each with its own line ending (LF, CRLF, or none on the last line; a bare CR
  stays inside its line), a byte-order mark included as U+FEFF. Lines are
  split on LF only. ``size`` and ``sha256`` always describe the WHOLE file,
  plus ``total_lines``, ``complete`` and what an editor needs to refuse a file
  it cannot write back unchanged (``line_endings``, ``bare_cr``, ``bom``).
  A file that is not valid UTF-8 is refused (422 ``not_utf8``) with a pointer
  to /files/read_bytes - never decoded with replacement characters.
- ``read_bytes`` returns the exact bytes, base64, of the whole file or of the range
  ``offset``/``length`` (so a file past the size limit is read in ranges), with the
  WHOLE file's size and SHA-256.
- A FIFO, socket or device is refused (400 ``not_a_regular_file``) before any
  blocking ``open``: a read never leaves a thread waiting for a writer.
- ``write`` is atomic: a temp file in the same directory, fsync, the old
  file's mode (and owner where permitted) applied, ``os.replace``, fsync of
  the directory. With ``expected_sha256`` it refuses (409 ``sha_mismatch``)
  when the file is not what the caller read. A symlink is written through.

Invariant: nothing here ever writes a partial file at the target path, and a
refused request leaves the file untouched.
"""

import base64
import binascii
import hashlib
import os
import stat
import tempfile
import threading
from typing import Any, Optional, Tuple

from .protocol import (
    ReadAnswer,
    ReadBytesAnswer,
    ReadBytesRequest,
    ReadRequest,
    WriteAnswer,
    WriteRequest,
)
from .wire import ApiError, file_mode, resolve

CHUNK = 1 << 20


class Files:
    def __init__(self, workspace: str, max_file_bytes: int) -> None:
        self.workspace = workspace
        self.max_file_bytes = max_file_bytes
        self._write_lock = threading.Lock()

    def _open_regular(self, path: str, check_size: bool = True) -> Tuple[Any, os.stat_result]:
        """The file opened for reading, refused (400) unless it is a regular file.

        A FIFO, socket or device is refused from ``stat`` before any ``open``, and the open
        itself is non-blocking (a FIFO swapped in after the ``stat`` cannot stall it), so
        no request thread ever waits in ``open`` for a writer that never comes."""
        try:
            _refuse_special(path, os.stat(path))
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise ApiError(404, "not_found", "%s does not exist" % path) from None
        except IsADirectoryError:
            raise ApiError(400, "is_a_directory", "%s is a directory, not a file" % path) from None
        except PermissionError:
            raise ApiError(403, "permission_denied", "execd may not read %s" % path) from None
        except OSError as e:
            raise ApiError(400, "unreadable", "cannot open %s: %s" % (path, e.strerror)) from None
        st = os.fstat(fd)
        try:
            _refuse_special(path, st)
        except ApiError:
            os.close(fd)
            raise
        os.set_blocking(fd, True)
        f = os.fdopen(fd, "rb")
        if check_size and st.st_size > self.max_file_bytes:
            f.close()
            raise ApiError(
                413,
                "too_large",
                "%s has %d bytes; the limit is %d (read it in ranges with /files/read_bytes "
                "offset and length)" % (path, st.st_size, self.max_file_bytes),
                limit=self.max_file_bytes,
            )
        return f, st

    def read(self, req: ReadRequest) -> ReadAnswer:
        path = resolve(self.workspace, req.path)
        f, _st = self._open_regular(path)
        sha = hashlib.sha256()
        size = 0
        lines = []
        number = 0
        crlf = lf = 0
        bare_cr = bom = False
        last = req.start_line + req.max_lines - 1 if req.max_lines is not None else None
        with f:
            for raw in f:  # split on b"\n" only; CR and CRLF stay in the line
                number += 1
                if number == 1:
                    bom = raw.startswith(b"\xef\xbb\xbf")
                size += len(raw)
                sha.update(raw)
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    raise ApiError(
                        422,
                        "not_utf8",
                        (
                            "%s is not valid UTF-8 (line %d, byte %d); a text read cannot "
                            "represent it exactly - use /files/read_bytes"
                        )
                        % (path, number, e.start),
                        use="/files/read_bytes",
                    ) from None
                if raw.endswith(b"\r\n"):
                    crlf += 1
                    bare_cr = bare_cr or b"\r" in raw[:-2]
                else:
                    lf += raw.endswith(b"\n")
                    bare_cr = bare_cr or b"\r" in raw
                if number >= req.start_line and (last is None or number <= last):
                    lines.append(text)
        content = "".join(lines)
        end_line = req.start_line + len(lines) - 1 if lines else req.start_line - 1
        return ReadAnswer(
            path=path,
            content=content,
            start_line=req.start_line,
            end_line=end_line,
            total_lines=number,
            complete=req.start_line <= 1 and end_line >= number,
            size=size,
            sha256=sha.hexdigest(),
            line_endings="mixed" if crlf and lf else "crlf" if crlf else "lf" if lf else "none",
            bare_cr=bare_cr,
            bom=bom,
        )

    def read_bytes(self, req: ReadBytesRequest) -> ReadBytesAnswer:
        """``length`` bytes from ``offset`` (to the end when None); at most
        ``max_file_bytes`` per call, while ``size`` and ``sha256`` are the WHOLE file's."""
        path = resolve(self.workspace, req.path)
        f, st = self._open_regular(path, check_size=False)
        with f:
            want = req.length if req.length is not None else max(0, st.st_size - req.offset)
            if want > self.max_file_bytes:
                raise ApiError(
                    413,
                    "too_large",
                    "%d bytes asked of %s; one read returns at most %d (send offset and length)"
                    % (want, path, self.max_file_bytes),
                    limit=self.max_file_bytes,
                )
            sha = hashlib.sha256()
            parts = []
            pos = 0
            for block in iter(lambda: f.read(CHUNK), b""):
                sha.update(block)
                lo, hi = max(req.offset - pos, 0), min(req.offset + want - pos, len(block))
                if lo < hi:
                    parts.append(block[lo:hi])
                pos += len(block)
        data = b"".join(parts)
        return ReadBytesAnswer(
            path=path,
            content_b64=base64.b64encode(data).decode("ascii"),
            size=pos,
            sha256=sha.hexdigest(),
            offset=req.offset,
            complete=req.offset == 0 and len(data) == pos,
        )

    def write(self, req: WriteRequest) -> WriteAnswer:
        path = os.path.realpath(resolve(self.workspace, req.path))
        if req.content is not None:
            try:
                data = req.content.encode("utf-8")
            except UnicodeEncodeError:
                raise ApiError(
                    400, "bad_value", "content holds unpaired surrogates; send bytes as content_b64"
                ) from None
        else:
            try:
                data = base64.b64decode(req.content_b64 or "", validate=True)
            except (binascii.Error, ValueError):
                raise ApiError(400, "bad_value", "content_b64 is not valid base64") from None
        mode = file_mode(req)
        parent = os.path.dirname(path)
        with self._write_lock:
            old = _existing(path)
            if req.expected_sha256 is not None:
                current = _sha256_file(path) if old is not None else None
                if current != req.expected_sha256:
                    raise ApiError(
                        409,
                        "sha_mismatch",
                        (
                            "%s changed since it was read: expected sha256 %s, found %s"
                            % (path, req.expected_sha256, current or "no file")
                        ),
                        current_sha256=current,
                    )
            if not os.path.isdir(parent):
                if not req.make_parents:
                    raise ApiError(
                        404,
                        "no_parent",
                        "the directory %s does not exist "
                        "(send make_parents: true to create it)" % parent,
                    )
                os.makedirs(parent, exist_ok=True)
            _atomic_write(path, data, mode, old)
        return WriteAnswer(path=path, size=len(data), sha256=hashlib.sha256(data).hexdigest())


_SPECIAL = (
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
)


def _refuse_special(path: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise ApiError(400, "is_a_directory", "%s is a directory, not a file" % path)
    for test, kind in _SPECIAL:
        if test(st.st_mode):
            raise ApiError(400, "not_a_regular_file", "%s is %s, not a regular file" % (path, kind))


def _existing(path: str) -> Optional[os.stat_result]:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ApiError(400, "unreadable", "cannot stat %s: %s" % (path, e.strerror)) from None
    _refuse_special(path, st)
    return st


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _atomic_write(
    path: str, data: bytes, mode: Optional[int], old: Optional[os.stat_result]
) -> None:
    parent, name = os.path.split(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix="." + name + ".", suffix=".execd-tmp", dir=parent)
    except PermissionError:
        raise ApiError(403, "permission_denied", "execd may not write in %s" % parent) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if mode is None:
                mode = stat.S_IMODE(old.st_mode) if old is not None else 0o666 & ~_umask()
            os.fchmod(f.fileno(), mode)
            if old is not None and (old.st_uid, old.st_gid) != (os.geteuid(), os.getegid()):
                try:
                    os.fchown(f.fileno(), old.st_uid, old.st_gid)
                except PermissionError:
                    pass  # not root: the file becomes ours, as any editor would make it
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _umask() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    return 0o022
