"""Secrets as the API server stores them: ``stringData`` folded into base64 ``data``.

"Secrets" (https://kubernetes.io/docs/concepts/configuration/secret/): ``data`` values are
base64-encoded; ``stringData`` is a write-only convenience whose entries are encoded into
``data`` (a key in both takes the ``stringData`` value) and never stored or returned; the
``type`` defaults to ``Opaque``. A ``data`` value that is not base64 is refused with 422
Invalid, as the API server's validation does. Pure; the store keeps the result.

Invariant: nothing reads ``stringData`` after :func:`prepare_secret` -- a stored Secret
looks exactly as a real one read back through the API.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from standin.store import StoreError


def prepare_secret(body: dict[str, Any]) -> dict[str, Any]:
    data = dict(body.get("data") or {})
    for key, value in data.items():
        try:
            base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise StoreError(
                422, f"data[{key}]: Invalid value: illegal base64 data", "Invalid"
            ) from None
    for key, value in (body.pop("stringData", None) or {}).items():
        data[key] = base64.b64encode(str(value).encode()).decode()
    body["data"] = data
    body.setdefault("type", "Opaque")
    return body
