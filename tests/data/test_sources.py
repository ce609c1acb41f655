"""A data source that is not there fails at once, in one line, like a model path does: a
mistyped local path never reaches the hub, and a hub name on a machine that cannot reach the hub
is read from the datasets cache or refused before any request (six retries took ~30 s)."""

from __future__ import annotations

import socket
import time

import datasets
import pytest
from huggingface_hub import constants

from proxrl.data import readers
from proxrl.models import tokenizer as tokenizer_module
from proxrl.runtime.errors import ProxrlError


@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """No DNS for the hub, no proxy, offline mode off, an empty datasets cache, and any call of
    load_dataset recorded."""

    def no_dns(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    for name in tokenizer_module.PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(tokenizer_module.socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    calls: list[str] = []

    def load_dataset(name, split):
        calls.append(name)
        return [{"prompt": "cached", "completion": " yes"}]

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    return calls


@pytest.mark.parametrize("source", ["sft_data", "my_prompts", "myorg/mydata", "myorg/mydata:test"])
def test_an_uncached_name_without_a_reachable_hub_fails_at_once(no_hub, source):
    started = time.perf_counter()
    with pytest.raises(ProxrlError) as info:
        readers.read_rows(source)
    assert str(info.value) == (
        f"data '{source}' is neither a local file or directory nor a datasets hub name in the "
        "local cache, and huggingface.co cannot be reached from here; check the path, or load "
        "the dataset once on a connected machine"
    )
    assert no_hub == [] and time.perf_counter() - started < 5


def test_a_name_in_the_datasets_cache_loads_from_it_in_offline_mode(no_hub, tmp_path):
    (tmp_path / "cache" / "myorg___my_data").mkdir(parents=True)  # datasets' own layout
    rows = readers.read_rows("myorg/MyData")
    assert [r.data for r in rows] == [{"prompt": "cached", "completion": " yes"}]
    assert no_hub == ["myorg/MyData"]
    assert constants.HF_HUB_OFFLINE and datasets.config.HF_HUB_OFFLINE


def test_a_reachable_hub_is_left_to_datasets(no_hub, monkeypatch):
    monkeypatch.setattr(tokenizer_module.socket, "getaddrinfo", lambda *a, **k: [])
    assert [r.where for r in readers.read_rows("myorg/mydata")] == ["myorg/mydata[train row 0]"]
    assert not constants.HF_HUB_OFFLINE


def test_a_path_that_looks_local_never_reaches_the_hub(no_hub, tmp_path, monkeypatch):
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    for source, message in [
        ("runs/sft_data", "data path 'runs/sft_data' does not exist"),
        ("./prompts", "data path './prompts' does not exist"),
        ("runs/data.jsonl", "data file 'runs/data.jsonl' does not exist"),
    ]:
        with pytest.raises(ProxrlError) as info:
            readers.check_data_source(source)
        assert str(info.value) == message
        with pytest.raises(ProxrlError, match="does not exist"):
            readers.read_rows(source)
    readers.check_data_source("myorg/mydata")  # a hub name: judged when it is read
    assert no_hub == []
