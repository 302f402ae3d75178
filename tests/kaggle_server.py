"""A stand-in for Kaggle's model API on `localhost:7777`, the endpoint `kagglesdk` calls with
`KAGGLE_API_ENVIRONMENT=TEST`: the RPCs `kagglehub` uses to fetch a model variation
(GetModelInstance, ListModelInstanceVersionFiles, DownloadModelInstanceVersion) and to publish
one (GetModel, CreateModel, StartBlobUpload and the blob's PUT, CreateModelInstance,
CreateModelInstanceVersion), over an in-memory store. Every RPC is logged; one the stand-in
does not implement (a client that changed its protocol) is recorded, and the `serve` block
fails at its end if there was any, instead of the test passing on a 404."""

import contextlib
import http.server
import json
import posixpath
import threading

PORT = 7777


class Kaggle:
    def __init__(self):
        self.models = set()  # (owner, model)
        self.variations = {}  # (owner, model, variation) -> [{path: bytes}, ...], one per version
        self.blobs = {}  # token -> [name, bytes]
        self.calls = []
        self.unexpected = []  # (method, path): requests outside the protocol above


def _handler(kaggle):
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body, content_type="application/json"):
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, value, code=200):
            self._send(code, json.dumps(value).encode())

        def _missing(self, what):
            self._json({"code": 404, "message": f"{what} not found"}, 404)

        def _files(self, request):
            key = (request.get("ownerSlug"), request.get("modelSlug"), request.get("instanceSlug"))
            versions = kaggle.variations.get(key)
            number = int(request.get("versionNumber") or 0)
            return versions[number - 1] if versions and 0 < number <= len(versions) else None

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            request = json.loads(body or b"{}")
            rpc = self.path.rsplit("/", 1)[-1]
            kaggle.calls.append(rpc)
            key = (request.get("ownerSlug"), request.get("modelSlug"))
            if rpc == "GetModelInstance":
                versions = kaggle.variations.get(key + (request.get("instanceSlug"),))
                return self._json({"versionNumber": len(versions)}) if versions else self._missing("Model")
            if rpc == "ListModelInstanceVersionFiles":
                files = self._files(request)
                if files is None:
                    return self._missing("Model version")
                return self._json({"files": [{"name": p, "totalBytes": len(d)} for p, d in files.items()],
                                   "nextPageToken": ""})
            if rpc == "DownloadModelInstanceVersion":
                files = self._files(request)
                if files is None or request.get("path") not in files:
                    return self._missing("File")
                return self._send(200, files[request["path"]], "application/octet-stream")
            if rpc == "GetModel":
                return self._json({"id": 1}) if key in kaggle.models else self._missing("Model")
            if rpc == "CreateModel":
                kaggle.models.add((request["ownerSlug"], request["slug"]))
                return self._json({"id": 1, "url": ""})
            if rpc == "StartBlobUpload":
                token = f"blob{len(kaggle.blobs)}"
                kaggle.blobs[token] = [request["name"], b""]
                return self._json({"token": token, "createUrl": f"http://localhost:{PORT}/upload/{token}"})
            if rpc in ("CreateModelInstance", "CreateModelInstanceVersion"):
                instance = request.get("instanceSlug") or request["body"].get("instanceSlug")
                files = {}
                self._unpack(request["body"], "", files)
                kaggle.variations.setdefault(key + (instance,), []).append(files)
                return self._json({"id": 1, "url": ""})
            kaggle.unexpected.append(("POST", self.path))
            self._json({"code": 400, "message": f"{rpc} is not implemented here"}, 400)

        def _unpack(self, directory, prefix, files):
            for item in directory.get("files", []):
                name, data = kaggle.blobs[item["token"]]
                files[posixpath.join(prefix, name)] = data
            for child in directory.get("directories", []):
                self._unpack(child, posixpath.join(prefix, child["name"]), files)

        def do_PUT(self):
            token = self.path.rsplit("/", 1)[-1]
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if not self.path.startswith("/upload/") or token not in kaggle.blobs:
                kaggle.unexpected.append(("PUT", self.path))
                return self._json({"code": 400, "message": "no such upload"}, 400)
            kaggle.blobs[token][1] = data
            self._json({})

    return Handler


@contextlib.contextmanager
def serve():
    """The stand-in, serving until the block ends (set KAGGLE_API_ENVIRONMENT=TEST)."""
    kaggle = Kaggle()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", PORT), _handler(kaggle))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield kaggle
    finally:
        server.shutdown()
        server.server_close()
    assert not kaggle.unexpected, f"requests the stand-in Kaggle does not implement: {kaggle.unexpected}"
