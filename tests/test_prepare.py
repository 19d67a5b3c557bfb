"""``microagent prepare <hub id>``: downloads from the hub it is given, refuses clearly without one.

Each case runs the real command in a child process with ``HF_ENDPOINT`` and ``HF_HOME`` set
(huggingface_hub reads both when imported): once against a small fake hub served from this
process (the hub's model-info, tree and resolve routes), once against a port where nothing
listens, as on a machine that reaches no hub.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = "org/tiny"
COMMIT = "c0ffee" + "0" * 34
FILES = {
    "config.json": b'{"model_type": "llama"}',
    "model.safetensors": b"not really weights",
    "onnx/model.onnx": b"a format vLLM does not load",
}


class _FakeHub(http.server.BaseHTTPRequestHandler):
    """The routes ``snapshot_download`` calls: revision info, the file tree, each file."""

    def log_message(self, format: str, *args: object) -> None:
        return None

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in {"Content-Length": str(len(body)), **headers}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        json_type = {"Content-Type": "application/json"}
        if path == f"/api/models/{REPO}/revision/main":
            info = {"id": REPO, "sha": COMMIT, "siblings": [{"rfilename": n} for n in FILES]}
            return self._send(200, json.dumps(info).encode(), json_type)
        if path == f"/api/models/{REPO}/tree/{COMMIT}":
            tree = [
                {"type": "file", "path": n, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                for n, b in FILES.items()
            ]
            return self._send(200, json.dumps(tree).encode(), json_type)
        for name, body in FILES.items():
            if path == f"/{REPO}/resolve/{COMMIT}/{name}":
                etag = f'"{hashlib.sha1(body).hexdigest()}"'
                return self._send(200, body, {"X-Repo-Commit": COMMIT, "ETag": etag})
        missing = {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}
        return self._send(404, b"{}", {**json_type, **missing})

    do_HEAD = do_GET


@pytest.fixture
def hub() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.fixture
def closed_endpoint() -> Iterator[str]:
    """A local port that is bound (no one else takes it) but not listening: refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"


def _prepare(model: str, endpoint: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "HF_ENDPOINT": endpoint,
        "HF_HOME": str(home / "hf"),
        "MICROAGENT_HOME": str(home / "microagent"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }
    env.pop("HF_HUB_OFFLINE", None)
    env.pop("HF_TOKEN", None)
    return subprocess.run(
        [sys.executable, "-m", "microagent", "prepare", model],
        capture_output=True,
        text=True,
        env=env,
        cwd=home,  # not the repository root, whose mailbox/ would shadow the stdlib's
        timeout=120,
    )


def test_prepare_downloads_a_hub_model_into_the_hf_cache(hub: str, tmp_path: Path) -> None:
    done = _prepare(REPO, hub, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"prepared {REPO!r} in "), done.stdout
    snapshot = Path(done.stdout.rsplit(": ", 1)[1].strip())
    assert snapshot == tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots" / COMMIT
    assert (snapshot / "config.json").read_bytes() == FILES["config.json"]
    assert (snapshot / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert not (snapshot / "onnx").exists()  # a format vLLM does not load is skipped


def test_prepare_names_a_repository_the_hub_does_not_have(hub: str, tmp_path: Path) -> None:
    done = _prepare("org/absent", hub, tmp_path)
    assert done.returncode == 1
    assert "prepared" not in done.stdout
    assert f"the hub at {hub} has no model 'org/absent'" in done.stderr
    assert "HF_TOKEN" in done.stderr and "Traceback" not in done.stderr


def test_prepare_says_when_no_hub_is_reachable(closed_endpoint: str, tmp_path: Path) -> None:
    done = _prepare(REPO, closed_endpoint, tmp_path)
    assert done.returncode == 1
    assert done.stdout == ""  # never "prepared" for a model it did not fetch
    err = done.stderr
    assert f"microagent prepare: error: cannot reach the model hub at {closed_endpoint}" in err
    assert "'org/tiny'" in err and "nothing was downloaded" in err
    assert "Connect" in err  # the network error itself (connection refused)
    assert "local model directory" in err and "Traceback" not in err
    assert not (tmp_path / "hf" / "hub" / "models--org--tiny" / "snapshots").exists()
