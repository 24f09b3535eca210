"""A real HTTP file server on the loopback interface, with faults a test can turn on, for the model fetch's tests.

``FileServer(root)`` serves the files under ``root`` from ``127.0.0.1`` on an ephemeral port, in a daemon thread
(``http.server.ThreadingHTTPServer``), as a context manager. It answers HEAD with the size (``Content-Length``),
GET with the whole file (200) or, given ``Range: bytes=N-`` (or ``bytes=N-M``), from byte N (206 and
``Content-Range``), which is all a resumable download asks of a model host. ``localhost`` reaches the same socket
under another name, so a test has two "hosts" (``url(name, host="localhost")``) without leaving the machine. The
server binds 127.0.0.1, or with ``bind`` the controller's address of the test fleet (an address of the fleet's own
network namespaces, tests/helpers/fleet.py), so that the fleet's hosts fetch from it.

Faults, set per test on the server's attributes (each is read at every request):

- ``cuts[path] = n``: the next GET of ``path`` announces the full ``Content-Length`` but sends only ``n`` bytes of
  the body and closes the socket (a dropped connection); used once, then the path is served whole again.
- ``missing``: paths answered 404.
- ``garbage``: paths answered with bytes that are not HTTP at all (another service listening on that port).
- ``redirects[path] = location``: 302 to ``location`` (a path on this server or a whole URL); two paths that name
  each other make a loop.
- ``required[path] = (header, value)``: 401 unless the request carries that header with that value (a token);
  ``"*"`` stands for every path. Checked before the redirects, as a model host checks a token before it sends
  the client to its storage.
- ``ignore_range``: GET answers 200 with the whole file even when asked for a range.
- ``head_allowed = False``: HEAD answers 405 (hosts that only allow GET).
- ``pause``: seconds to sleep after each ``block`` bytes of a body, so a download takes long enough to be cut into
  pieces by its own clock.

``log`` lists every request received, in order, as ``Request(method, path, range, host, headers)`` (``headers``
with lower-case names), so a test can tell what a client sent: the ``Range`` of a resume, the token or its
absence after a redirect to the other host, or no request at all; ``take()`` returns it and starts a new one.
"""
from __future__ import annotations

import os
import re
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import NamedTuple

LOOPBACK = "127.0.0.1"
_RANGE_RE = re.compile(r"^bytes=(\d+)-(\d*)$")


class Request(NamedTuple):
    """One request as the server received it: ``client`` is the peer's address, ``at`` the ``time.monotonic()``
    of its arrival."""
    method: str
    path: str
    range: str | None
    host: str
    headers: dict
    client: str = ""
    at: float = 0.0


class _Server6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


class FileServer:
    """Serves ``root`` over HTTP on 127.0.0.1 (see the module's docstring for the faults and the log), or on
    ``bind``: the controller's address of the test fleet (tests/helpers/fleet.py), which its hosts reach."""

    def __init__(self, root, block=64 * 1024, bind=LOOPBACK):
        self.bind = bind
        self.root = os.fspath(root)
        self.block = block
        self.cuts = {}
        self.missing = set()
        self.garbage = set()
        self.redirects = {}
        self.required = {}
        self.ignore_range = False
        self.head_allowed = True
        self.pause = 0.0
        self.log = []
        self._lock = threading.Lock()
        self._httpd = None
        self._thread = None

    # --- life cycle ------------------------------------------------------------------------------------------

    def __enter__(self):
        self._httpd = (_Server6 if ":" in self.bind else ThreadingHTTPServer)((self.bind, 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.files = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="FileServer", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)
        return False

    @property
    def port(self):
        return self._httpd.server_address[1]

    def url(self, name, host=None):
        """The URL of ``name`` (a path under ``root``) through ``host`` (by default the address it binds;
        ``localhost`` for the other name of 127.0.0.1)."""
        host = host or self.bind
        return "http://%s:%d/%s" % ("[%s]" % host if ":" in host else host, self.port,
                                    urllib.parse.quote(name.lstrip("/")))

    # --- the log ---------------------------------------------------------------------------------------------

    def _record(self, request):
        with self._lock:
            self.log.append(request)

    def take(self):
        """The requests received since the last ``take()`` (all of them the first time); the log starts over."""
        with self._lock:
            taken, self.log = self.log, []
        return taken


class _Handler(BaseHTTPRequestHandler):
    """Answers one request from the ``FileServer`` set on the server (``self.server.files``)."""

    protocol_version = "HTTP/1.0"  # one request per connection: a cut is the end of that connection

    def log_message(self, format, *args):
        """Quiet: the test reads ``FileServer.log``, not stderr."""

    def do_HEAD(self):
        self._answer("HEAD")

    def do_GET(self):
        self._answer("GET")

    def _answer(self, method):
        files = self.server.files
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        headers = {k.lower(): v for k, v in self.headers.items()}
        files._record(Request(method, path, headers.get("range"), headers.get("host", ""), headers,
                              self.client_address[0], time.monotonic()))
        try:
            self._respond(files, method, path, headers)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client stopped reading (the end of its piece): nothing to tell it
        self.close_connection = True

    def _status(self, code, extra=()):
        self.send_response(code)
        for name, value in extra:
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _respond(self, files, method, path, headers):
        if path in files.garbage:
            self.wfile.write(b"SSH-2.0-OpenSSH_9.2\r\n")
            return None
        if method == "HEAD" and not files.head_allowed:
            return self._status(405, [("Allow", "GET")])
        need = files.required.get(path) or files.required.get("*")
        if need and headers.get(need[0].lower()) != need[1]:
            return self._status(401, [("WWW-Authenticate", "Bearer")])
        if path in files.redirects:
            return self._status(302, [("Location", files.redirects[path])])
        local = os.path.join(files.root, path.lstrip("/"))
        if path in files.missing or not os.path.isfile(local):
            return self._status(404)
        size = os.path.getsize(local)
        start = 0
        match = _RANGE_RE.match(headers.get("range") or "")
        end = size - 1
        if match and not files.ignore_range:
            start = int(match.group(1))
            end = min(int(match.group(2)), end) if match.group(2) else end
            if start >= size or end < start:
                return self._status(416, [("Content-Range", "bytes */%d" % size)])
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, size))
        else:
            self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "none" if files.ignore_range else "bytes")
        self.send_header("Content-Length", str(end + 1 - start))
        self.end_headers()
        if method == "HEAD":
            return None
        cut = files.cuts.pop(path, None)
        self._send_body(files, local, start, end + 1 - start if cut is None else min(cut, end + 1 - start))
        if cut is not None:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)  # fewer bytes than announced, then the end
        return None

    def _send_body(self, files, local, start, count):
        with open(local, "rb") as f:
            f.seek(start)
            while count > 0:
                data = f.read(min(files.block, count))
                if not data:
                    break
                self.wfile.write(data)
                count -= len(data)
                if files.pause:
                    self.wfile.flush()
                    time.sleep(files.pause)
