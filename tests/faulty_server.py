"""A local HTTP server that serves a folder the way a good server does (ETag, Last-Modified,
Range with If-Range, 416) and misbehaves on purpose, one fault per request, as real
servers and networks do."""

import contextlib
import functools
import hashlib
import http.server
import os
import threading

HTML = b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1><p>Try again later.</p></body></html>\n"

# fault name -> what the next request of the path gets
FAULTS = (
    "html",  # 200 with an HTML error page (and its own Content-Length)
    "empty",  # 200 with an empty body
    "cut",  # 200 (or 206) with the right Content-Length, then the connection closes halfway
    "cut_no_length",  # 200 without Content-Length, half the body, then the connection closes
    "status_500",  # HTTP 500
    "status_204",  # HTTP 204 (not an error, but no file)
    "status_416",  # 416 whatever the request
    "ignore_range",  # 200 with the whole file, whatever the Range
)


class Faults(dict):
    """`{path: [fault, ...]}`, each fault one of `FAULTS`: a misspelled one fails the test that
    sets it (on the server it would serve the good file, and the test would check nothing)."""

    def __setitem__(self, path, faults):
        unknown = [f for f in faults if f not in FAULTS]
        assert not unknown, f"unknown faults {unknown}; each is one of {FAULTS}"
        super().__setitem__(path, list(faults))


class FaultyHandler(http.server.BaseHTTPRequestHandler):
    """Serves `root`; `faults[path]` is a list of fault names, one taken per request."""

    protocol_version = "HTTP/1.1"

    def __init__(self, *args, root, faults, requests, **kwargs):
        self.root, self.faults, self.requests = root, faults, requests
        super().__init__(*args, **kwargs)

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.requests.append((self.path, dict(self.headers)))
        queue = self.faults.get(self.path)
        fault = queue.pop(0) if queue else None
        path = os.path.join(self.root, self.path.lstrip("/"))
        if fault in ("status_500", "status_204", "status_416"):
            return self._send(int(fault[-3:]), b"" if fault != "status_500" else b"error")
        if fault == "html":
            return self._send(200, HTML, content_type="text/html")
        if not os.path.isfile(path):
            return self._send(404, b"not found")
        data = open(path, "rb").read()
        if fault == "empty":
            return self._send(200, b"")
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        start = self._range_start(etag, len(data)) if fault != "ignore_range" else None
        if start is not None and start >= len(data):
            return self._send(416, b"", headers={"Content-Range": f"bytes */{len(data)}"})
        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
        status, body = 200, data
        if start is not None:
            status, body = 206, data[start:]
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if fault == "cut_no_length":
            self.send_response(200)
            self.send_header("ETag", etag)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.close_connection = True
            return
        if fault == "cut":
            return self._send(status, body, headers=headers, cut=True)
        self._send(status, body, headers=headers)

    def _range_start(self, etag, size):
        wanted = self.headers.get("Range")
        if not wanted or not wanted.startswith("bytes=") or not wanted.endswith("-"):
            return None
        condition = self.headers.get("If-Range")
        if condition is not None and condition != etag:
            return None  # another version: the whole file (RFC 9110)
        return int(wanted[len("bytes="):-1])

    def _send(self, status, body, content_type="application/octet-stream", headers=None, cut=False):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        if status != 204:
            self.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        if cut:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body[: len(body) // 2] if cut else body)
        if cut:
            self.close_connection = True


@contextlib.contextmanager
def faulty_server(root):
    """Serve `root`: yields `(url, faults, requests)`; put fault lists in `faults[path]`."""
    faults, requests = Faults(), []
    handler = functools.partial(FaultyHandler, root=root, faults=faults, requests=requests)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, args=(0.01,), daemon=True)  # shut down within 10 ms
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", faults, requests
    finally:
        httpd.shutdown()
        httpd.server_close()
