"""The one fetcher (`txl_io.fetch`) against a local server that misbehaves on purpose: each
case ends in the right file or in one clear error, and the next run against a good server
succeeds without anyone deleting a file by hand."""

import io
import json
import os
import zipfile

import pytest
from faulty_server import faulty_server

from tf_records import download
from txl_io.fetch import DownloadError, fetch


def payload(size=300_000, seed=0):
    """Bytes that differ at every offset (a resume onto the wrong offset shows)."""
    import numpy as np

    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8).tobytes()


@pytest.fixture
def served(tmp_path):
    root = tmp_path / "server"
    root.mkdir()
    (root / "blob.bin").write_bytes(payload())
    with faulty_server(str(root)) as (url, faults, requests):
        yield root, url, faults, requests


def tree(folder):
    """`{relative path: bytes}` of everything under `folder`."""
    return {os.path.relpath(os.path.join(d, f), folder): open(os.path.join(d, f), "rb").read()
            for d, _, found in os.walk(folder) for f in found}


def must_be(expected):
    def check(path):
        data = open(path, "rb").read()
        if data != expected:
            raise ValueError(f"{len(data)} bytes that are not the file")
    return check


def quiet(*_):
    pass


@pytest.mark.parametrize("fault", ["html", "empty", "cut_no_length"])
def test_a_wrong_body_is_moved_aside_and_fetched_again(served, tmp_path, fault, capsys):
    root, url, faults, _ = served
    faults["/blob.bin"] = [fault]
    target = str(tmp_path / "cache" / "blob.bin")
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)
    assert open(target, "rb").read() == payload()
    warning = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and target + ".rejected" in warning[0]
    assert sorted(os.listdir(tmp_path / "cache")) == ["blob.bin", "blob.bin.rejected"]


def test_a_wrong_body_twice_is_one_clear_error_and_a_good_server_then_succeeds(served, tmp_path):
    root, url, faults, _ = served
    faults["/blob.bin"] = ["html", "html"]
    target = str(tmp_path / "cache" / "blob.bin")
    with pytest.raises(DownloadError) as error:
        fetch(f"{url}/blob.bin", target, check=must_be(payload()), hint="Point MIRROR at a mirror.", log=quiet)
    message = str(error.value)
    assert f"{url}/blob.bin" in message and "an HTML page" in message and "MIRROR" in message
    assert target + ".rejected" in message and "\n" not in message
    assert not os.path.exists(target)
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)  # the server is good again
    assert open(target, "rb").read() == payload()


def test_an_html_page_is_never_taken_for_the_file_even_without_a_check(served, tmp_path, capsys):
    _, url, faults, _ = served
    faults["/blob.bin"] = ["html"]
    target = str(tmp_path / "blob.bin")
    fetch(f"{url}/blob.bin", target, log=quiet)
    assert open(target, "rb").read() == payload()
    assert "an HTML page" in capsys.readouterr().err


def test_a_file_already_there_is_checked_before_it_is_used(served, tmp_path):
    _, url, _, requests = served
    target = tmp_path / "blob.bin"
    target.write_bytes(HTML_KEPT := b"<html>kept from an earlier, broken run</html>")
    fetch(f"{url}/blob.bin", str(target), check=must_be(payload()), log=quiet)
    assert target.read_bytes() == payload() and (tmp_path / "blob.bin.rejected").read_bytes() == HTML_KEPT
    before = len(requests)
    fetch(f"{url}/blob.bin", str(target), check=must_be(payload()), log=quiet)  # good: no request
    assert len(requests) == before


def test_a_cut_connection_is_resumed_with_if_range(served, tmp_path):
    _, url, faults, requests = served
    faults["/blob.bin"] = ["cut"]
    target = str(tmp_path / "blob.bin")
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)
    assert open(target, "rb").read() == payload()
    resumed = requests[-1][1]
    assert resumed.get("Range", "").startswith("bytes=") and resumed.get("If-Range", "").startswith('"')


def test_a_complete_partial_answered_416_is_finished(served, tmp_path):
    _, url, _, requests = served
    target = str(tmp_path / "blob.bin")
    whole = payload()
    open(target + ".partial", "wb").write(whole)  # killed after the last write, before the rename
    json.dump({"url": f"{url}/blob.bin", "length": len(whole), "etag": None, "last_modified": None},
              open(target + ".partial.json", "w"))
    fetch(f"{url}/blob.bin", target, check=must_be(whole), log=quiet)
    assert open(target, "rb").read() == whole and len(requests) == 1
    assert sorted(os.listdir(tmp_path)) == ["blob.bin", "server"]


@pytest.mark.parametrize("record", [None, "other url", "no validator"])
def test_a_partial_of_unknown_origin_is_never_resumed_onto(served, tmp_path, record):
    _, url, _, requests = served
    target = str(tmp_path / "blob.bin")
    open(target + ".partial", "wb").write(b"someone else's bytes" * 100)
    if record is not None:
        json.dump({"url": f"{url}/other" if record == "other url" else f"{url}/blob.bin", "length": None,
                   "etag": "\"x\"" if record == "other url" else None, "last_modified": None},
                  open(target + ".partial.json", "w"))
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)
    assert open(target, "rb").read() == payload()
    assert "Range" not in requests[-1][1]


def test_a_file_changed_on_the_server_between_two_runs_is_fetched_whole(served, tmp_path):
    root, url, faults, requests = served
    target = str(tmp_path / "blob.bin")
    faults["/blob.bin"] = ["cut", "status_500", "status_500"]  # the first run ends with half of the old file
    with pytest.raises(DownloadError, match="HTTP 500"):
        fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)
    assert 0 < os.path.getsize(target + ".partial") < len(payload())
    (root / "blob.bin").write_bytes(payload(seed=1))  # a new version, same size
    fetch(f"{url}/blob.bin", target, check=must_be(payload(seed=1)), log=quiet)
    assert open(target, "rb").read() == payload(seed=1)
    assert "If-Range" in requests[-1][1]  # it asked to resume, and the server sent the new file whole


def test_a_server_that_ignores_the_range_restarts_the_file(served, tmp_path):
    _, url, faults, _ = served
    faults["/blob.bin"] = ["cut", "ignore_range"]
    target = str(tmp_path / "blob.bin")
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)
    assert open(target, "rb").read() == payload()


@pytest.mark.parametrize("fault, named", [("status_500", "HTTP 500"), ("status_204", "HTTP 204"),
                                          ("status_416", "HTTP 416")])
def test_other_status_codes_are_errors_naming_the_url(served, tmp_path, fault, named):
    _, url, faults, _ = served
    faults["/blob.bin"] = [fault] * 3
    target = str(tmp_path / "blob.bin")
    with pytest.raises(DownloadError) as error:
        fetch(f"{url}/blob.bin", target, log=quiet)
    assert f"{url}/blob.bin" in str(error.value) and named in str(error.value)
    assert not os.path.exists(target)
    faults.clear()
    fetch(f"{url}/blob.bin", target, check=must_be(payload()), log=quiet)


def test_a_missing_file_is_not_retried(served, tmp_path):
    _, url, _, requests = served
    with pytest.raises(DownloadError, match="HTTP 404"):
        fetch(f"{url}/nothing.bin", str(tmp_path / "nothing.bin"), log=quiet)
    assert len(requests) == 1


def wikitext_zip():
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for split in ("train", "valid", "test"):
            archive.writestr(f"wikitext-2/wiki.{split}.tokens", f" = {split} = \n the cat sat \n")
    return buffer.getvalue()


def test_a_corpus_download_is_checked_healed_and_unpacked(tmp_path, monkeypatch):
    root = tmp_path / "server"
    root.mkdir()
    (root / "wikitext-2-v1.zip").write_bytes(wikitext_zip())
    data_dir = tmp_path / "raw"
    outside = tree(str(root))
    with faulty_server(str(root)) as (url, faults, _):
        monkeypatch.setitem(download.SOURCES, "wt2", [(f"{url}/wikitext-2-v1.zip", "wikitext-2-v1.zip", True)])
        faults["/wikitext-2-v1.zip"] = ["html", "html"]
        with pytest.raises(DownloadError, match="an HTML page.*copy it to"):
            download.download("wt2", str(data_dir), log=quiet)
        faults["/wikitext-2-v1.zip"] = ["cut_no_length", "cut_no_length"]
        with pytest.raises(DownloadError, match="not the zip archive of wt2.*copy it to"):
            download.download("wt2", str(data_dir), log=quiet)
        faults["/wikitext-2-v1.zip"] = ["cut_no_length"]  # healed on the second fetch
        download.download("wt2", str(data_dir), log=quiet)
    assert (data_dir / "wiki.valid.tokens").read_text() == " = valid = \n the cat sat \n"
    assert tree(str(root)) == outside


def test_an_unreachable_network_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(download.SOURCES, "enwik8", [("http://127.0.0.1:9/enwik8.zip", "enwik8.zip", False)])
    with pytest.raises(DownloadError, match="Cannot download http://127.0.0.1:9/enwik8.zip.*copy it to"):
        download.download("enwik8", str(tmp_path), timeout=5, log=quiet)
    assert not os.listdir(tmp_path)  # nothing half-written left behind
