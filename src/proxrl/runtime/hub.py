"""Whether the Hugging Face hub can be reached from here, and what a name that is not a hub id
looks like: shared by the model and the data loaders, so an air-gapped machine fails at once
instead of retrying downloads for a minute."""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)


def looks_like_local_path(name_or_path: str) -> bool:
    """A string the user meant as a directory rather than a hub id (``org/name``): absolute,
    ``./`` or ``~``-relative, deeper than ``org/name``, or under a directory that exists here
    (``runs/sft`` when ``runs/`` exists). Such a string is never sent to the hub, whose
    offline retries take about a minute to fail."""
    return (
        os.path.isabs(name_or_path)
        or name_or_path.startswith((".", "~"))
        or name_or_path.count("/") > 1
        or ("/" in name_or_path and os.path.isdir(name_or_path.split("/", 1)[0]))
    )


PROXY_VARIABLES = (
    "HTTPS_PROXY",
    "https_proxy",
    "HTTP_PROXY",
    "http_proxy",
    "ALL_PROXY",
    "all_proxy",
)


def unreachable_hub_host() -> str | None:
    """The hub's host name when it does not resolve from here (so a download would only retry
    until it times out), else None: also None in offline mode (the libraries then read the cache
    only and fail at once) and behind a proxy (which may resolve what this machine cannot)."""
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return None
    if any(os.environ.get(name) for name in PROXY_VARIABLES):
        return None
    host = urlparse(constants.ENDPOINT).hostname or constants.ENDPOINT
    return None if host_resolves(host) else host


def use_hub_cache_only(host: str, name: str) -> None:
    """Switch this process (and those it starts) to Hugging Face's offline mode, so ``name`` is
    read from the local cache without a request."""
    from huggingface_hub import constants

    log.warning(
        "%s cannot be reached: loading %s from the local Hugging Face cache (offline mode)",
        host,
        name,
    )
    constants.HF_HUB_OFFLINE = True
    os.environ["HF_HUB_OFFLINE"] = "1"


def host_resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, 443)
    except OSError:
        return False
    return True
