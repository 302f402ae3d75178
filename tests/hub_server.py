"""A stand-in for the Hugging Face Hub on a local HTTP server: the endpoints
`huggingface_hub` uses to fetch a repository (revision, tree, resolve) and to publish a folder
(create, preupload, commit), over an in-memory store. Every request is logged; one the
stand-in does not implement (a client that changed its protocol) is recorded, and the
`serve` block fails at its end if there was any, instead of the test passing on a 404."""

import base64
import contextlib
import hashlib
import http.server
import json
import threading

COMMIT = "c" * 40


class Hub:
    def __init__(self):
        self.repos = {}  # "owner/name" -> {path: bytes}
        self.requests = []  # (method, path)
        self.unexpected = []  # (method, path, what): requests outside the protocol above


def _handler(hub):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body=b"", headers=None):
            self.send_response(code)
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _json(self, value):
            self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

        def _unexpected(self, what):
            hub.unexpected.append((self.command, self.path, what))
            self._send(400, json.dumps({"error": what}).encode(), {"Content-Type": "application/json"})

        def _missing(self):
            self._send(404, b'{"error": "Repository not found"}', {"X-Error-Code": "RepoNotFound",
                                                                   "Content-Type": "application/json"})

        def do_GET(self):
            hub.requests.append((self.command, self.path))
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts[:2] == ["api", "models"]:
                repo = "/".join(parts[2:4])
                if repo not in hub.repos:
                    return self._missing()
                stored = hub.repos[repo]
                endpoint = parts[4] if len(parts) > 4 else None
                if endpoint == "revision":
                    return self._json({"id": repo, "sha": COMMIT, "siblings": [{"rfilename": p} for p in stored]})
                if endpoint == "tree":
                    return self._json([{"type": "file", "path": p, "size": len(d), "oid": hashlib.sha1(d).hexdigest()}
                                       for p, d in stored.items()])
                return self._unexpected("an /api/models endpoint other than revision and tree")
            repo, path = "/".join(parts[:2]), "/".join(parts[4:])
            if len(parts) <= 4 or parts[2] != "resolve":
                return self._unexpected("a GET other than the API's and resolve")
            if path in hub.repos.get(repo, {}):
                data = hub.repos[repo][path]
                return self._send(200, data, {"X-Repo-Commit": COMMIT,
                                              "ETag": '"' + hashlib.sha1(data).hexdigest() + '"'})
            self._missing()

        do_HEAD = do_GET

        def do_POST(self):
            hub.requests.append((self.command, self.path))
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            parts = self.path.split("?")[0].strip("/").split("/")
            if parts == ["api", "repos", "create"]:
                request = json.loads(body)
                repo = f"{request['organization']}/{request['name']}"
                hub.repos.setdefault(repo, {})
                return self._json({"url": f"http://{self.headers['Host']}/{repo}", "name": repo})
            if len(parts) < 5 or parts[:2] != ["api", "models"]:
                return self._unexpected("a POST other than create, preupload and commit")
            repo = "/".join(parts[2:4])
            if repo not in hub.repos:
                return self._missing()
            if parts[4] == "preupload":
                return self._json({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                             for f in json.loads(body)["files"]]})
            if parts[4] == "commit":
                items = [json.loads(line) for line in body.decode().splitlines()]
                odd = [i for i in items if i["key"] not in ("header", "file")
                       or i["key"] == "file" and i["value"].get("encoding") != "base64"]
                if odd:  # LFS files, deletions, another encoding: not stored here
                    return self._unexpected(f"commit operations other than base64 files: {odd}")
                for item in items:
                    if item["key"] == "file":
                        hub.repos[repo][item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                return self._json({"commitUrl": f"http://{self.headers['Host']}/{repo}/commit/{COMMIT}",
                                   "commitOid": COMMIT, "pullRequestUrl": None})
            self._unexpected("a POST to a repository other than preupload and commit")

    return Handler


@contextlib.contextmanager
def serve():
    """`(hub, url)` of a stand-in hub running until the block ends."""
    hub = Hub()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
    assert not hub.unexpected, f"requests the stand-in hub does not implement: {hub.unexpected}"
