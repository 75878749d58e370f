"""How long to wait before retrying a remote service (the Hub, an LLM endpoint): what its
Retry-After header asks, up to a minute, or exponential backoff from `base_s`, up to 30 s."""
from __future__ import annotations


def retry_after(response, attempt: int, base_s: float) -> float:
    """`attempt` counts from 0; `response` is the failed HTTP response, if there was one."""
    header = response.headers.get("Retry-After") if response is not None else None
    if header and header.replace(".", "", 1).isdigit():
        return min(float(header), 60.0)
    return min(base_s * 2 ** attempt, 30.0)
