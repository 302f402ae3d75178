"""One HTTP(S) fetcher for the corpora and the released models, that no server or network
can wedge.

`fetch(url, path, check=...)`:
- writes into `<path>.partial`, beside `<path>.partial.json`, which records the URL, the
  size the server announced and its validators (`ETag`, `Last-Modified`);
- resumes a partial file only when the server confirms it is the same file: a range
  request with `If-Range` (the validator) or, without one, the recorded size, answered
  `206` with that size; anything else fetches the whole file again;
- `416` on a partial file that already holds the recorded size finishes the download; any
  status other than 200/206, and a body shorter or longer than `Content-Length`, is an
  error naming the URL (a dropped connection is resumed twice first);
- `check(path)` says what the file must be (it raises ValueError or OSError naming what is
  wrong): it runs on the finished file and on a file already there, after the check that
  it is not an HTML page (unless an `.html` file was asked for). A file that fails is
  moved aside to `<path>.rejected` (one warning line) and fetched again once; a second
  failure is a `DownloadError` naming the URL, the file, what was wrong and `hint` (where
  else the file can come from). The file at `path` is renamed into place last: it is
  either absent or complete.
"""

import http.client
import json
import os
import sys
import urllib.error
import urllib.request

CHUNK = 1 << 20
ATTEMPTS = 3  # a dropped connection is resumed (or restarted) twice
FINAL_STATUS = (401, 403, 404, 410)  # no retry helps


class DownloadError(OSError):
    """A file that cannot be fetched whole and right; the message names the URL and the way out."""


def warn(text):
    print(f"warning: {text}", file=sys.stderr, flush=True)


def fetch(url, path, check=None, hint="", log=None, timeout=60):
    """`path`, holding `url`'s file, fetched (or resumed) if absent and checked (see above)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if os.path.exists(path):
        problem = _problem(check, path)
        if problem is None:
            return path
        _reject(path, problem)
    for round_ in (1, 2):
        _download(url, path, log, timeout, hint)
        problem = _problem(check, path)
        if problem is None:
            return path
        rejected = _reject(path, problem, again=round_ == 1)
    raise DownloadError(f"{url} arrived twice as a file that is not what it must be ({problem}); it is kept as "
                        f"{rejected} for a look. {hint}".strip())


def _problem(check, path):
    """What is wrong with the file at `path` (None: nothing): an HTML page where another file
    was asked for (a server's error page served with status 200), or what `check` says."""
    if not path.endswith((".html", ".htm")):
        with open(path, "rb") as f:
            start = f.read(512).lstrip().lower()
        if start.startswith((b"<!doctype html", b"<html")):
            return "an HTML page, where the file was expected (a server's error page?)"
    if check is None:
        return None
    try:
        check(path)
    except (ValueError, OSError) as e:
        return " ".join(str(e).split()) or type(e).__name__
    return None


def _reject(path, problem, again=True):
    rejected = path + ".rejected"
    os.replace(path, rejected)
    if again:
        warn(f"{path} is not what it must be ({problem}); moved to {rejected}, fetching it again")
    return rejected


def _download(url, path, log, timeout, hint):
    partial = path + ".partial"
    error = "the connection closed before the whole file arrived"
    for _ in range(ATTEMPTS):
        try:
            if _transfer(url, partial, log, timeout, hint):
                os.replace(partial, path)
                _remove(partial + ".json")
                return
        except DownloadError:
            raise
        except urllib.error.HTTPError as e:
            error = f"HTTP {e.code} {e.reason}"
            if e.code in FINAL_STATUS:
                break
        except (OSError, http.client.HTTPException) as e:  # (URLError is an OSError)
            error = getattr(e, "reason", None) or e
    raise DownloadError(f"Cannot download {url} ({error}). {hint}".strip())


def _transfer(url, partial, log, timeout, hint):
    """Append the rest of `url` to `partial` (or start it over); True once it holds the whole file."""
    record = _read_record(partial, url)
    have = os.path.getsize(partial) if os.path.exists(partial) and record else 0
    headers = {}
    if have:
        headers["Range"] = f"bytes={have}-"
        if record.get("etag") or record.get("last_modified"):
            headers["If-Range"] = record.get("etag") or record["last_modified"]
    try:
        response = urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=timeout)
    except urllib.error.HTTPError as e:
        if e.code == 416 and have:
            if have == record.get("length"):
                return True  # the partial file already held all of it
            _start_over(partial)
            return False
        raise
    with response:
        if response.status == 206 and have and _same_file(response, have, record):
            total = record.get("length")
        elif response.status == 200:
            have, total = 0, _length(response.headers.get("Content-Length"))
            record = {"url": url, "length": total, "etag": response.headers.get("ETag"),
                      "last_modified": response.headers.get("Last-Modified")}
            with open(partial + ".json", "w", encoding="utf-8") as f:
                json.dump(record, f)
        elif response.status == 206:  # another file's range, or a range not asked for
            _start_over(partial)
            return False
        else:
            raise DownloadError(f"Cannot download {url}: the server answered HTTP {response.status} where "
                                f"200 (the file) or 206 (its rest) is expected. {hint}".strip())
        have = _append(response, partial, have, _progress(url, total, log))
    if total is not None and have > total:
        _start_over(partial)
        return False
    return total is None or have == total


def _append(response, partial, have, report):
    with open(partial, "ab" if have else "wb") as f:
        while True:
            chunk = response.read(CHUNK)
            if not chunk:
                return have
            f.write(chunk)
            have += len(chunk)
            report(have)


def _same_file(response, have, record):
    """Whether a 206 continues the recorded file at `have`: `Content-Range: bytes have-.../length`."""
    content_range = response.headers.get("Content-Range", "")
    try:
        unit, rest = content_range.split(" ", 1)
        span, total = rest.split("/")
        start = int(span.split("-")[0])
    except ValueError:
        return False
    recorded = record.get("length")
    return unit == "bytes" and start == have and (recorded is None or total == str(recorded))


def _read_record(partial, url):
    """The record of `partial` when it was started from `url`, else None (the partial is not ours to resume)."""
    try:
        with open(partial + ".json", encoding="utf-8") as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("url") != url:
        return None
    if not (record.get("etag") or record.get("last_modified") or isinstance(record.get("length"), int)):
        return None  # nothing the server could confirm
    return record


def _length(value):
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _start_over(partial):
    _remove(partial)
    _remove(partial + ".json")


def _remove(path):
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def _progress(url, total, log):
    """One line redrawn in place on a terminal; otherwise a line at every 10% (to `log`)."""
    name = url.rsplit("/", 1)[-1]
    if total and log is None and sys.stderr.isatty():
        def redraw(done):
            end = "\n" if done >= total else ""
            print(f"\rdownloading {name}: {100 * done // total:3d}% of {total / 1e6:,.1f} MB", end=end,
                  file=sys.stderr, flush=True)

        return redraw
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    marks = {max(1, total * k // 10) for k in range(1, 11)} if total else set()
    shown = set()

    def report(done):
        for mark in sorted(m for m in marks if m <= done and m not in shown):
            shown.add(mark)
            say(f"downloading {name}: {100 * mark // total}% of {total / 1e6:,.1f} MB")

    return report
