"""The per-sandbox token derived from a job's key: HMAC-SHA256(key, sandbox name), in hex.

One function, shared by execd (``--token-key-file KEY --token-name NAME``) and the service
(which writes the same token on the sandbox's row), so the two can never disagree.

Rules a reader must not break: the key is the file's bytes with surrounding whitespace
stripped (a Secret's value, or a hex string written by hand with a newline); the name is
UTF-8; the result equals ``hmac.new(key, name, hashlib.sha256).hexdigest()`` (a test checks
it). HMAC (RFC 2104) is spelled out over CPython's built-in SHA-256 because ``hmac`` and
``hashlib`` load OpenSSL, ~3.5 MiB of RSS an idle execd need not carry (as ``app.py``'s
``compare_digest``). Standard library only, Python 3.8.
"""

import functools
import importlib
from typing import Any, Callable

_BLOCK = 64  # SHA-256's block size in bytes


@functools.lru_cache(maxsize=1)  # a failed import searches sys.path every time: once
def _sha256() -> Callable[..., Any]:
    # CPython's built-in SHA-256: _sha2 from 3.12, _sha256 before; hashlib elsewhere.
    for module in ("_sha2", "_sha256", "hashlib"):
        try:
            sha256: Callable[..., Any] = importlib.import_module(module).sha256
            return sha256
        except (ImportError, AttributeError):
            continue
    raise ImportError("no SHA-256 implementation")


def derive_token(key: bytes, name: str) -> str:
    """The token of sandbox ``name`` under the job's ``key`` (64 lowercase hex digits)."""
    key = key.strip()
    if not key:
        raise ValueError("an empty key derives no token")
    sha256 = _sha256()
    if len(key) > _BLOCK:
        key = sha256(key).digest()
    key = key.ljust(_BLOCK, b"\0")
    inner = sha256(bytes(b ^ 0x36 for b in key) + name.encode("utf-8")).digest()
    return str(sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest())
