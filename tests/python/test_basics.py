"""The package itself: version, errors, the job file through the C loader."""
from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tessera
from tessera import _client

from conftest import ASYNC_SGD1

ROOT = Path(__file__).resolve().parents[2]


def test_version_is_the_library_s():
    assert tessera.__version__ == _client.version
    assert importlib.metadata.version("tessera") == tessera.__version__
    header = (ROOT / "include/tessera/client.h").read_text()
    parts = [header.split(f"#define TESSERA_VERSION_{k} ")[1].split()[0]
             for k in ("MAJOR", "MINOR", "PATCH")]
    assert tessera.__version__ == ".".join(parts)


def test_error_mapping():
    cases = {
        _client.ESHAPE: tessera.ShapeError, _client.ESIZE: tessera.ShapeError,
        _client.ENOTENSOR: tessera.UnknownTensor, _client.EUNAVAIL: tessera.Unavailable,
        _client.ECLOSED: tessera.Unavailable, _client.ETIMEDOUT: tessera.DeadlineExceeded,
        _client.EAUTH: tessera.AuthError, _client.EPERM: tessera.PermissionDenied,
        _client.ESHUTDOWN: tessera.Interrupted, _client.EINVAL: tessera.InvalidArgument,
        _client.ECONFIG: tessera.ConfigError, _client.EINTERNAL: tessera.TesseraError,
        -111: tessera.Unavailable,
    }
    for code, cls in cases.items():
        e = tessera._errors.from_code(code, "shard 1 (127.0.0.1:7101): something")
        assert type(e) is cls, (code, type(e))
        assert e.code == code
        assert "something" in str(e)
    e = tessera._errors.from_code(_client.ETIMEDOUT, "late")
    assert e.name == "ETIMEDOUT" and isinstance(e, TimeoutError)
    assert isinstance(e, tessera.Unavailable)
    assert tessera.NotFound is tessera.UnknownTensor
    assert issubclass(tessera.ShapeError, ValueError)
    assert tessera._errors.from_code(-111, "refused").name == "ECONNREFUSED"


def test_load_job_matches_the_demo_file():
    job = tessera.load_job(ROOT / "deploy/local/cluster.cfg", use_env=False)
    assert job.ps == ["127.0.0.1:7100", "127.0.0.1:7101"]
    assert job.mode == "sync" and job.optimizer == "adam"
    assert job.layers == [784, 128, 10] and job.seed == 42 and job.num_workers == 2
    assert job.task_index == -1
    job = tessera.load_job(ROOT / "deploy/local/cluster.cfg",
                           ["job.mode=async", "optimizer.learning_rate=0.5"], use_env=False)
    assert job.mode == "async" and job.learning_rate == 0.5


def test_load_job_errors_name_the_key(tmp_path):
    p = tmp_path / "bad.cfg"
    p.write_text('job = { mode = "fast"; };\n')
    with pytest.raises(tessera.ConfigError) as ei:
        tessera.load_job(p, use_env=False)
    assert "job.mode" in str(ei.value) and "bad.cfg:1" in str(ei.value)
    with pytest.raises(tessera.ConfigError):
        tessera.load_job(None, ["no.such.key=1"], use_env=False)


def test_tf_config(monkeypatch):
    tf = {"cluster": {"ps": ["127.0.0.1:7300", "127.0.0.1:7301"],
                      "worker": ["127.0.0.1:7400", "127.0.0.1:7401"]},
          "task": {"type": "worker", "index": 1}}
    job = tessera.load_job(None, tf_config=json.dumps(tf))
    assert job.ps == tf["cluster"]["ps"] and job.task_index == 1 and job.task_role == "worker"
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match="TF_CONFIG"):
        tessera.Client()
    monkeypatch.setenv("TF_CONFIG", json.dumps({"cluster": {"chief": ["h:1"]}}))
    with pytest.raises(tessera.ConfigError):
        tessera.Client()


def test_client_from_tf_config(cluster, monkeypatch):
    cl = cluster(2, 2)
    tf = {"cluster": {"ps": cl.addrs, "worker": ["127.0.0.1:1", "127.0.0.1:2"]},
          "task": {"type": "worker", "index": 1}}
    monkeypatch.setenv("TF_CONFIG", json.dumps(tf))
    with tessera.Client(timeout=10) as c:
        assert c.task == 1 and c.num_shards == 2 and c.mode == "async"
        c.declare({"x": 4})
        st = c.status(0)
        assert st.workers[0].task == 1 and "python task 1" in st.workers[0].identity


def test_job_file_checked_at_the_handshake(cluster):
    """A client given a job file sends the settings a job shares, as ps-worker does: one
    whose optimizer differs from the shards' is refused naming the key and both values, and
    the shard goes on serving the others."""
    cl = cluster(2, 2, 'job = { mode = "async"; };\n'
                       'optimizer = { name = "adam"; learning_rate = 0.001; };\n')
    with pytest.raises(tessera.ConfigError) as ei:
        tessera.Client(cl.config, overrides=["optimizer.learning_rate=0.002"], connect_timeout=5)
    assert re.search(r"optimizer\.learning_rate: this worker has 0\.002, shard [01] has 0\.001",
                     str(ei.value)), str(ei.value)
    with tessera.Client(cl.config, timeout=10) as c:      # the same job file: accepted
        assert c.job.job_settings[0] == ("job.mode", '"async"')
        c.declare({"w": 4})


def test_connect_refused_is_unavailable():
    from conftest import free_port
    with pytest.raises(tessera.Unavailable):
        tessera.Client(cluster=[f"127.0.0.1:{free_port()}"], connect_timeout=0.5)


def test_token_from_the_job_file(cluster, tmp_path):
    token = tmp_path / "token"
    token.write_text("correct horse battery staple\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("incorrect horse battery staple\n")
    short = tmp_path / "short"
    short.write_text("short\n")
    cl = cluster(1, 1, f'auth = {{ token_file = "{token}"; }};\n')
    with tessera.Client(cl.config, timeout=5) as c:       # auth.token_file of the job
        c.declare({"w": 4})
    with pytest.raises(tessera.AuthError) as ei:
        tessera.Client(cluster=cl.addrs, token_file=str(wrong), connect_timeout=3)
    assert ei.value.name == "EAUTH"
    with pytest.raises(tessera.AuthError):
        tessera.Client(cluster=cl.addrs, connect_timeout=3)  # no token at all
    with pytest.raises(tessera.ConfigError, match="at least 16"):
        tessera.Client(cluster=cl.addrs, token_file=str(short))


def test_shard_must_prove_the_token(cluster, tmp_path):
    # A client with a token wants the shard's proof of it (docs/security.md, "Knowing the
    # shard is a shard"): a server that cannot give it (here a shard without a token, as a
    # stranger on its address would be) is refused with AuthError, saying why.
    token = tmp_path / "token"
    token.write_text("correct horse battery staple\n")
    cl = cluster(1, 1, "")
    with pytest.raises(tessera.AuthError, match="did not prove it knows the token") as ei:
        tessera.Client(cluster=cl.addrs, token_file=str(token), connect_timeout=3)
    assert ei.value.name == "EAUTH"
    with tessera.Client(cluster=cl.addrs, connect_timeout=3) as c:  # no token: as before
        c.declare({"w": 4})


def test_tls_from_the_job_file(cluster, tmp_path):
    # auth.tls (docs/security.md, "Encryption between hosts"): the job file's three files
    # take the package's client through TLS 1.3; a CA that did not sign the shard's
    # certificate is refused with AuthError saying so, and a plaintext client is refused
    # in words.
    certs = tmp_path / "certs"
    subprocess.run(["bash", str(ROOT / "tests/lib/make_tls_certs.sh"), str(certs)], check=True)
    auth = (f'auth = {{ tls = true; tls_ca_file = "{certs}/ca.pem"; '
            f'tls_cert_file = "{certs}/shard.pem"; tls_key_file = "{certs}/shard.key"; }};\n'
            'server = { handshake_timeout_s = 1.0; };\n')
    cl = cluster(2, 1, ASYNC_SGD1 + auth)
    with tessera.Client(cl.config, timeout=10) as c:
        c.declare({"w": 1000})
        c.push({"w": np.ones(1000, np.float32)})
        assert np.array_equal(c.pull()["w"], np.full(1000, -1.0, np.float32))
    other = (str(certs / "other-ca.pem"), str(certs / "client.pem"), str(certs / "client.key"))
    with pytest.raises(tessera.AuthError, match="no CA of auth.tls_ca_file signed it"):
        tessera.Client(cluster=cl.addrs, tls=other, connect_timeout=3)
    with pytest.raises(tessera.TesseraError, match="this shard requires TLS"):
        tessera.Client(cluster=cl.addrs, connect_timeout=3)


def test_status_checkpoint_failures_job_id_workers_joined(cluster, tmp_path):
    """ShardStatus carries what psctl status shows beside the counters: checkpoint failures
    in a row with the last reason, the job's id, and the workers that took part."""
    ck = tmp_path / "ck"
    cl = cluster(1, 1, 'job = { mode = "async"; };\n'
                       'optimizer = { name = "sgd"; learning_rate = 1.0; };\n'
                       f'checkpoint = {{ dir = "{ck}"; interval_s = 3600; }};\n')
    with tessera.Client(str(cl.config), timeout=10) as w, \
            tessera.Client(str(cl.config), admin=True, timeout=10) as adm:
        st = adm.status(0)
        assert (st.job_id, st.checkpoint_failures, st.checkpoint_error) == ("", 0, "")
        w.declare({"w": 8})
        w.push({"w": np.ones(8, np.float32)})
        w.heartbeat()
        st = adm.status(0)
        assert re.fullmatch(r"[0-9a-f]{16}", st.job_id), st.job_id
        assert st.workers_joined == 1 and st.num_workers == 1
        # The directory replaced by a regular file: the next checkpoint fails (root
        # writes through a chmod), and the status says how often and why.
        for f in ck.iterdir():
            f.unlink()
        ck.rmdir()
        ck.write_text("not a directory\n")
        with pytest.raises(tessera.TesseraError):
            adm.checkpoint(0)
        st = adm.status(0)
        assert st.checkpoint_failures == 1
        assert "Not a directory" in st.checkpoint_error, st.checkpoint_error
