"""Text and codes from a peer (docs/security.md): a fake shard (tests/lib/fake_shard.c,
built with the C tree) answers with error code -3 and strings full of ESC, BEL, CR/LF, an
8-bit CSI and bytes that are not UTF-8. The package raises only its own error classes with
the library's codes (the unknown code as ProtocolError, EPROTO, naming -3), and no string
it returns or raises holds a control byte."""
from __future__ import annotations

import subprocess
from typing import Iterator

import pytest

import tessera
from conftest import BUILD

FAKE_SHARD = BUILD / "tests" / "lib" / "fake-shard"


def _clean(text: str) -> bool:
    return not any(ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F for ch in text)


def _fake(*args: str) -> Iterator[str]:
    if not FAKE_SHARD.exists():
        pytest.fail(f"{FAKE_SHARD} missing: build the C tree first")
    p = subprocess.Popen([str(FAKE_SHARD), *args], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        yield f"127.0.0.1:{int(p.stdout.readline())}"
    finally:
        p.kill()
        p.wait()


@pytest.fixture
def fake() -> Iterator[str]:
    yield from _fake()


@pytest.fixture
def fake_handshake_error() -> Iterator[str]:
    yield from _fake("--handshake-error")


def test_status_strings_are_clean(fake):
    with tessera.Client(cluster=[fake], admin=True, timeout=5, connect_timeout=3) as c:
        st = c.status(0)
        w = st.workers[0]
        for text in (w.device, w.identity, st.last_checkpoint, *(t["name"] for t in st.tables)):
            assert _clean(text), repr(text)
        assert w.device.startswith("/gpu:0\\x1b]0;pwned\\x07")


def test_unknown_code_is_eproto(fake):
    with tessera.Client(cluster=[fake], admin=True, timeout=5, connect_timeout=3) as c:
        with pytest.raises(tessera.ProtocolError) as e:
            c.checkpoint(0)
    assert e.value.name == "EPROTO"
    assert "error code -3" in str(e.value)
    assert _clean(str(e.value)), repr(str(e.value))
    with tessera.Client(cluster=[fake], task=0, timeout=5, connect_timeout=3) as c:
        with pytest.raises(tessera.ProtocolError) as e:
            c.heartbeat()
    assert e.value.name == "EPROTO" and _clean(str(e.value))


def test_refused_handshake(fake_handshake_error):
    with pytest.raises(tessera.TesseraError) as e:
        tessera.Client(cluster=[fake_handshake_error], admin=True, timeout=3, connect_timeout=2)
    assert e.value.name != "UNKNOWN" and e.value.code != -3
    assert "error code -3" in str(e.value)
    assert _clean(str(e.value)), repr(str(e.value))
