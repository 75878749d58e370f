"""The last guard on what leaves a sandbox worker: every string a child returns, and every
line of its log, has this process's secrets replaced before it reaches a record, a store, the
rejects, the stats or workers.log.

Workers get no secret (their environment is cleared), so a secret in a child's output means
one slipped in some other way. A task that holds one can spell it out in many ways; the forms
searched here are those a line of Python makes in passing: the value as it is, any letter
case, with anything that is not a letter or digit between its characters (`s.k-t h e`,
`s\\nk`), reversed, base64 (standard or URL-safe, at any of the three byte alignments), hex
(with or without separators, `0x` or `\\x` prefixes) and URL-encoding (any character as
`%XX`). Each secret is compiled once into one regex of all its forms.
"""
from __future__ import annotations

import base64
import functools
import os
import re

REDACTED = "[redacted]"
# What names an environment variable holding a secret: a worker's environment passes none of them.
SECRET_NAME = re.compile(r"KEY|TOKEN|SECRET|PASSW|CREDENTIAL|AUTH|COOKIE|SESSION", re.IGNORECASE)
MIN_SECRET = 6  # shorter values (`AUTH_MODE=on`) are words, not secrets
MIN_CORE = 6  # letters and digits a loose form needs, or it would match ordinary text
# What may stand between two characters of a spelt-out secret: anything but letters and
# digits, or a URL-encoded character (a `%` that starts one is never a separator of its own).
GAP = r"(?:%[0-9A-Fa-f]{2}|(?!%[0-9A-Fa-f]{2})[^0-9A-Za-z])*"
HEX_GAP = r"(?:[^0-9A-Za-z]|0x|x)*"  # `73 6b`, `73:6b`, `0x73,0x6b`, `\x73\x6b`


def secret_values() -> tuple[str, ...]:
    """The values of this process's secret-looking environment variables (`*KEY*`,
    `*TOKEN*`, `*SECRET*`, ...), longest first so that a secret holding another goes whole."""
    values = {value for name, value in os.environ.items() if SECRET_NAME.search(name) and len(value) >= MIN_SECRET}
    return tuple(sorted(values, key=lambda value: (-len(value), value)))


def redact(text: str, secrets: tuple[str, ...] | None = None) -> str:
    """`text` with every form of every secret replaced by `[redacted]`."""
    for pattern in patterns(secret_values() if secrets is None else tuple(secrets)):
        text = pattern.sub(REDACTED, text)
    return text


def clean_strings(obj, max_chars: int | None = None):
    """`obj` with every string in it, dictionary keys included, redacted and cut to
    `max_chars`: what a child sends back, made fit to keep."""
    secrets = secret_values()
    return _clean(obj, secrets, max_chars)


def _clean(obj, secrets: tuple[str, ...], max_chars: int | None):
    if isinstance(obj, str):
        text = redact(obj, secrets)
        return text if max_chars is None else text[:max_chars]
    if isinstance(obj, dict):
        return {_clean(key, secrets, max_chars): _clean(value, secrets, max_chars) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clean(item, secrets, max_chars) for item in obj)
    return obj


@functools.lru_cache(maxsize=8)
def patterns(secrets: tuple[str, ...]) -> tuple[re.Pattern, ...]:
    """One compiled regex per secret, matching every form of it."""
    return tuple(_pattern(secret) for secret in secrets)


def _pattern(secret: str) -> re.Pattern:
    forms = [re.escape(secret)]
    core = re.sub(r"[^0-9A-Za-z]", "", secret)
    if len(core) >= MIN_CORE:
        forms += [_spelt(core), _spelt(core[::-1])]
    data = secret.encode()
    forms += [f"(?-i:{re.escape(encoded)})" for encoded in _base64_forms(data) if len(encoded) >= MIN_CORE]
    forms.append(HEX_GAP.join(f"{byte:02x}" for byte in data))
    return re.compile("|".join(f"(?:{form})" for form in forms), re.IGNORECASE)


def _spelt(core: str) -> str:
    """`core`'s characters in order with anything but letters and digits between them, each
    as itself or URL-encoded (`%73`)."""
    return GAP.join(f"(?:%{ord(char):02x}|{re.escape(char)})" for char in core)


def _base64_forms(data: bytes) -> list[str]:
    """The part of `data`'s base64 that does not depend on what stands around it, for each
    of the three offsets it may start at in a longer encoded text, standard and URL-safe.
    `k` bytes before it spoil the first 0, 2 or 3 characters; bytes after it the last one."""
    forms = []
    for k, skip in ((0, 0), (1, 2), (2, 3)):
        encoded = base64.b64encode(bytes(k) + data).decode()
        whole = (k + len(data)) * 8 // 6  # characters made of these bytes' bits alone
        stable = encoded[skip:whole]
        forms += [stable, stable.replace("+", "-").replace("/", "_")]
    return list(dict.fromkeys(forms))
