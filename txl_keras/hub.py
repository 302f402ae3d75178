"""Presets on model hubs, through the hubs' own client libraries (the `hub` extra).

- `hf://owner/name`: a Hugging Face Hub model repository (`huggingface_hub`; `HF_ENDPOINT`
  names another server, `HF_TOKEN` or `hf auth login` the account);
- `kaggle://owner/model/keras/variation[/version]`: a Kaggle model variation (`kagglehub`;
  `KAGGLE_USERNAME`/`KAGGLE_KEY` or `~/.kaggle/kaggle.json` the account).

`download(handle)` gives a local folder (Hugging Face's files cached in
`$KERAS_HOME/txl_keras/hub/hf`, Kaggle's in kagglehub's cache; `cache_dir` overrides both), which the presets' folder loaders then read like any other;
`upload(handle, folder)` publishes a folder as it is. Nothing here reaches a network unless
a handle is given.
"""

import os
import re

from txl_keras.releases import cache_root

HANDLE = re.compile(r"(hf|kaggle)://(.*)")
HF_REPO = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
KAGGLE_HANDLE = re.compile(r"[\w.-]+/[\w.-]+/[\w.-]+/[\w.-]+(/\d+)?")
CLIENTS = {"hf": "huggingface_hub", "kaggle": "kagglehub"}


class HubError(ValueError):
    """A handle that cannot be fetched or published: one line naming it."""


def is_handle(preset):
    return isinstance(preset, str) and HANDLE.fullmatch(preset) is not None


def parse(handle):
    """`(scheme, path)` of a handle, checked against its hub's form."""
    match = HANDLE.fullmatch(handle) if isinstance(handle, str) else None
    if match is None:
        raise HubError(f"{handle!r} is not a hub handle: hf://owner/name or kaggle://owner/model/keras/variation.")
    scheme, path = match.groups()
    if scheme == "hf" and not HF_REPO.fullmatch(path):
        raise HubError(f"{handle!r} is not a Hugging Face handle: hf://owner/name.")
    if scheme == "kaggle" and not KAGGLE_HANDLE.fullmatch(path):
        raise HubError(f"{handle!r} is not a Kaggle model handle: kaggle://owner/model/keras/variation[/version].")
    return scheme, path


def _client(scheme):
    name = CLIENTS[scheme]
    try:
        return __import__(name)
    except ImportError:
        raise HubError(f"{scheme}:// handles are fetched with the {name} library, which is not installed: "
                       "pip install -e \".[hub]\" (or pip install txl_keras[hub]).") from None


def cache_folder(scheme, cache_dir=None):
    """Where a hub's downloads are kept: `cache_dir`, else `$KERAS_HOME/txl_keras/hub/<scheme>`."""
    return os.path.join(cache_root(cache_dir), "hub", scheme)


def download(handle, cache_dir=None, force_download=False):
    """The local folder of a handle's files (fetched once, then read from the cache)."""
    scheme, path = parse(handle)
    client = _client(scheme)
    try:
        if scheme == "hf":
            return client.snapshot_download(path, cache_dir=cache_folder(scheme, cache_dir),
                                            endpoint=os.environ.get("HF_ENDPOINT"), force_download=force_download)
        output = None if cache_dir is None else os.path.join(cache_folder(scheme, cache_dir), path)
        return client.model_download(path, force_download=force_download, output_dir=output)
    except Exception as e:  # the clients' errors (missing repository, network, account), in one line
        raise HubError(f"Cannot fetch {handle}: {_reason(e)}") from None


def upload(handle, folder):
    """Publish `folder`'s files as `handle` (the repository or variation made if missing)."""
    scheme, path = parse(handle)
    client = _client(scheme)
    try:
        if scheme == "hf":
            api = client.HfApi(endpoint=os.environ.get("HF_ENDPOINT"))
            api.create_repo(path, exist_ok=True)
            api.upload_folder(repo_id=path, folder_path=folder, commit_message="Upload a txl_keras preset")
        else:
            client.model_upload(path, folder)
    except Exception as e:
        raise HubError(f"Cannot upload to {handle}: {_reason(e)}") from None


def _reason(error):
    """The first line of a client's error, with what kind of error it is."""
    if "NotFound" in type(error).__name__ or "404" in str(error)[:40]:
        return "no such repository on the hub (or it is private: log in to the hub first)."
    text = " ".join(str(error).split("\n")[:2]).strip() or type(error).__name__
    return f"{type(error).__name__}: {text[:300]}"
