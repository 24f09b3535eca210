"""The real llama-server (llama.cpp b10435, CPU + RPC, built by scripts/llama-cpp.sh) for the integration tests.

``free_port()`` is a free loopback port; ``llama_server()`` starts the server on one, waits for ``/health`` 200
(or its exit, or the timeout) and always stops it by its own pid; ``run_until_healthy()`` does both and
returns what the run showed.
"""
from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

SERVER = shutil.which("llama-server")
HOST = "127.0.0.1"
STOP_TIMEOUT = 30


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class LlamaServer(object):
    """One run: ``url``; ``exited`` (its exit code, None while it ran) and ``healthy`` once started;
    ``stderr`` (the whole log) once stopped."""

    def __init__(self, url):
        self.url = url
        self.exited = None
        self.healthy = False
        self.stderr = ""


@contextlib.contextmanager
def llama_server(args, timeout, log=None, with_stdout=False):
    """Run ``llama-server ARGS --host 127.0.0.1 --port FREE`` until ``/health`` is 200, it exits or
    ``timeout`` seconds pass; yield its ``LlamaServer``; stop it (terminate, then kill) on leaving.

    Its stderr (and its stdout too with ``with_stdout``, else nothing of it) goes to the file ``log``
    (a temporary file when None) and ends up in ``LlamaServer.stderr``.
    """
    port = free_port()
    server = LlamaServer("http://%s:%d" % (HOST, port))
    cmd = [SERVER] + [str(a) for a in args] + ["--host", HOST, "--port", str(port)]
    with (open(log, "w+") if log else tempfile.TemporaryFile(mode="w+")) as out:
        proc = subprocess.Popen(cmd, stdout=out if with_stdout else subprocess.DEVNULL,
                                stderr=subprocess.STDOUT if with_stdout else out)
        try:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    with urllib.request.urlopen(server.url + "/health", timeout=2) as resp:
                        if resp.status == 200:
                            server.healthy = True
                            break
                except (urllib.error.URLError, OSError):
                    pass
                time.sleep(0.2)
            server.exited = proc.poll()
            yield server
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            out.seek(0)
            server.stderr = out.read()


def run_until_healthy(args, timeout):
    """Run the server until ``/health`` is 200 (or it exits); return (returncode or None, healthy, stderr)."""
    with llama_server(args, timeout) as server:
        pass
    return server.exited, server.healthy, server.stderr
