"""The real llama-server (llama.cpp b10435, CPU + RPC, built by scripts/llama-cpp.sh) for the integration tests.

``free_port()`` is a free loopback port; ``llama_server()`` starts the server on one, waits for ``/health`` 200
(or its exit, or the timeout) and always stops it by its own pid; ``run_until_healthy()`` does both and
returns what the run showed. ``on_a_free_port()`` starts any server again on another port when its port was
taken; ``listening()`` tells whether a process listens on a port.
"""
from __future__ import annotations

import contextlib
import os
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
BIND_TRIES = 3


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


class LlamaServer(object):
    """One run: ``url``; ``proc`` (its process); ``exited`` (its exit code, None while it ran) and ``healthy``
    once started; ``stderr`` (the whole log) once stopped."""

    def __init__(self, url):
        self.url = url
        self.proc = None
        self.exited = None
        self.healthy = False
        self.stderr = ""


@contextlib.contextmanager
def llama_server(args, timeout, log=None, with_stdout=False):
    """Run ``llama-server ARGS --host 127.0.0.1 --port FREE`` until ``/health`` is 200, it exits or
    ``timeout`` seconds pass; yield its ``LlamaServer``; stop it (terminate, then kill) on leaving.

    Its stderr (and its stdout too with ``with_stdout``, else nothing of it) goes to the file ``log``
    (a temporary file when None) and ends up in ``LlamaServer.stderr``.

    The port is free when picked, but a test running at the same time can take it before the server binds
    it: a run that exits with llama-server's ``couldn't bind HTTP server socket`` is started again on another
    port (BIND_TRIES in all), so that each test sees the run it asked for.
    """
    for attempt in range(1, BIND_TRIES + 1):
        port = free_port()
        server = LlamaServer("http://%s:%d" % (HOST, port))
        cmd = [SERVER] + [str(a) for a in args] + ["--host", HOST, "--port", str(port)]
        with (open(log, "w+") if log else tempfile.TemporaryFile(mode="w+")) as out:
            proc = subprocess.Popen(cmd, stdout=out if with_stdout else subprocess.DEVNULL,
                                    stderr=subprocess.STDOUT if with_stdout else out)
            server.proc = proc
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
                if server.exited is not None and attempt < BIND_TRIES and _port_taken(out, port):
                    continue
                yield server
                return
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


def _port_taken(out, port):
    """Whether the log in ``out`` says that the server could not bind ``port``."""
    out.flush()
    out.seek(0)
    return port_taken(out.read(), port)


def on_a_free_port(start, taken):
    """``start(port)`` on a port free_port() found, again on another (BIND_TRIES in all) while
    ``taken(result, port)``: a test running at the same time can take the port before the server binds it."""
    for _attempt in range(BIND_TRIES - 1):
        port = free_port()
        result = start(port)
        if not taken(result, port):
            return result
    return start(free_port())


def listening(pid, port):
    """Whether process ``pid`` listens on the IPv4 TCP ``port`` (Linux's /proc): a port that answers may be
    another process's, taken since free_port()."""
    try:
        fds = os.listdir("/proc/%d/fd" % pid)
    except OSError:  # the process is gone
        return False
    sockets = set()
    for fd in fds:
        with contextlib.suppress(OSError):
            link = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            if link.startswith("socket:["):
                sockets.add(link[len("socket:["):-1])
    with open("/proc/net/tcp") as table:
        next(table)  # the header
        for row in table:
            fields = row.split()  # sl local_address rem_address st ... inode (the 10th)
            if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port and fields[9] in sockets:
                return True  # 0A: LISTEN
    return False


def port_taken(log, port):
    """Whether llama-server's ``log`` (text) says that it could not bind ``port``: taken since free_port()."""
    return "couldn't bind HTTP server socket, hostname: %s, port: %d" % (HOST, port) in log


def run_until_healthy(args, timeout):
    """Run the server until ``/health`` is 200 (or it exits); return (returncode or None, healthy, stderr)."""
    with llama_server(args, timeout) as server:
        pass
    return server.exited, server.healthy, server.stderr
