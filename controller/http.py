"""The one HTTP call shape the controller uses, so tests and the simulator can swap the network out.

A transport is `(method, url, headers, body, timeout_s) -> (status, body)`. It returns HTTP error
statuses instead of raising and raises ConnectionError when no answer came back.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable

Transport = Callable[[str, str, dict[str, str], bytes | None, float], tuple[int, bytes]]


def urllib_transport(
    method: str, url: str, headers: dict[str, str], body: bytes | None, timeout_s: float
) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=body, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"{method} {url}: {exc}") from exc
