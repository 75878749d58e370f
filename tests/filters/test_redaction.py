"""The last guard on what leaves a worker: a secret of this process is found in every simple
spelling a task could give it, and nothing else is touched."""
import base64
import random
import string
import time
from urllib.parse import quote

import pytest

from filters.sandbox import jail, redaction

SECRET = "sk-the-secret-value-123"
DATA = SECRET.encode()
FORMS = {
    "as is": SECRET,
    "upper case": SECRET.upper(),
    "a space between letters": " ".join(SECRET),
    "newlines and dots between letters": "\n.".join(SECRET.replace("-", "")),
    "reversed": SECRET[::-1],
    "reversed and spaced": " ".join(SECRET[::-1]),
    "base64": base64.b64encode(DATA).decode(),
    "base64 after one byte": base64.b64encode(b"x" + DATA).decode(),
    "base64 after two bytes": base64.b64encode(b"xy" + DATA + b"z").decode(),
    "URL-safe base64": base64.urlsafe_b64encode(b"\xfb" + DATA).decode(),
    "hex": DATA.hex(),
    "upper-case hex with colons": DATA.hex(":").upper(),
    "escaped hex": "".join(f"\\x{byte:02x}" for byte in DATA),
    "0x hex": ", ".join(f"0x{byte:02x}" for byte in DATA),
    "URL-encoded": quote(SECRET, safe=""),
    "every character URL-encoded": "".join(f"%{byte:02X}" for byte in DATA),
    "URL-encoded in part": "sk%2Dthe%2dsecret-v%61lue-123",
}


@pytest.mark.parametrize("form", FORMS, ids=list(FORMS))
def test_every_simple_spelling_of_a_secret_is_redacted(form):
    text = f"before {FORMS[form]} after"
    cleaned = redaction.redact(text, (SECRET,))
    assert redaction.REDACTED in cleaned and cleaned.startswith("before ") and cleaned.endswith(" after"), cleaned
    left = cleaned.replace(redaction.REDACTED, "")
    assert "secret" not in left.lower() and "terces" not in left.lower() and DATA.hex() not in left.lower()
    assert len(left) <= len("before  after") + 6, cleaned  # at most the edges of an encoding are left


def test_a_value_that_merely_shares_a_prefix_or_a_part_is_kept():
    text = "sk-the-secret-value-124 sk-the-secret-value-12 the secret value sk-the-other-value-123"
    assert redaction.redact(text, (SECRET,)) == text


def test_the_environment_supplies_the_secrets(monkeypatch):
    monkeypatch.setenv("OPSYNTH_TEST_API_KEY", SECRET)
    monkeypatch.setenv("OPSYNTH_TEST_MODE", "sk-not-a-secret-name")
    assert SECRET in redaction.secret_values() and "sk-not-a-secret-name" not in redaction.secret_values()
    assert redaction.redact(SECRET[::-1]) == jail.redact(SECRET[::-1]) == redaction.REDACTED


def test_clean_strings_reaches_every_string_and_key(monkeypatch):
    monkeypatch.setenv("OPSYNTH_TEST_TOKEN", SECRET)
    spelt = "-".join(SECRET)
    dirty = {"detail": spelt, "metrics": {spelt: 1.0, "note": [SECRET[::-1], 2, (DATA.hex(), None)], "ok": True}}
    clean = redaction.clean_strings(dirty)
    assert clean == {"detail": "[redacted]", "metrics": {"[redacted]": 1.0, "note": ["[redacted]", 2, ("[redacted]", None)],
                                                         "ok": True}}
    assert redaction.clean_strings({"a": "x" * 50}, max_chars=10) == {"a": "x" * 10}


def test_a_megabyte_of_log_is_redacted_in_well_under_a_second():
    secrets = (SECRET, "hf_another_secret_value_456", "ghp_0123456789abcdefABCDEF")
    rng = random.Random(0)
    text = "".join(rng.choice(string.printable) for _ in range(1 << 20))
    redaction.patterns(secrets)  # compiled once per set of secrets
    start = time.perf_counter()
    assert redaction.redact(text, secrets) == text
    assert time.perf_counter() - start < 1.0
