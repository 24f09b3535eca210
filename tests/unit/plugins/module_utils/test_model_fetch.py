"""The fetch of a model onto the host (plugins/module_utils/_model_fetch.py): the download in pieces from a real HTTP
server on 127.0.0.1 (tests/helpers/http_server.py) with its faults, the checks before a rename and the record.
Its sources and checksums: test_model_sources.py; the clean-up: test_model_cleanup.py.

Models are real GGUF files written by gguf-py (split ones as gguf-split names and keys them); every figure a test
expects comes from the files it wrote (their bytes, ``hashlib``, ``os.stat``) or from what the server logged.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_fetch
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import PART_SUFFIX, fetch
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_sources import FetchError
from tests.helpers.model_hosts import fetch_all, sha, split_names, state, write_model

MIB = 1 << 20


def closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------- the download


def test_a_model_comes_in_pieces_each_resuming_where_the_last_stopped_and_an_unchanged_rerun_asks_nothing(
        www, server, host, monkeypatch):
    """Blocks of 32 KiB, sent with a pause, and pieces of 50 ms: the download takes several pieces. The size and
    the SHA256SUMS file are asked for once: the later pieces get them from the first."""
    monkeypatch.setattr(_model_fetch, "CHUNK", 32 * 1024)
    server.block, server.pause = 32 * 1024, 0.02
    served = write_model(www / "m.gguf", seed=1)[0]
    (www / "SHA256SUMS").write_text("%s  m.gguf\n" % sha(served))
    size = os.path.getsize(served)
    args = host.args([server.url("m.gguf")], "m.gguf", piece_seconds=0.05, sha256=[server.url("SHA256SUMS")])

    pieces = fetch_all(args)

    assert len(pieces) >= 2
    log = server.take()
    assert [(r.method, r.path) for r in log[:2]] == [("GET", "/SHA256SUMS"), ("HEAD", "/m.gguf")]
    log = log[2:]
    gets = [r for r in log if r.method == "GET"]
    assert [(r.method, r.path) for r in log] == [("GET", "/m.gguf")] * len(pieces)
    done_before = [sum(p["bytes_fetched"] for p in pieces[:i]) for i in range(len(pieces))]
    assert [g.range for g in gets] == [None] + ["bytes=%d-" % n for n in done_before[1:]]
    assert sum(p["bytes_fetched"] for p in pieces) == size
    assert [p["bytes_have"] for p in pieces] == [n + p["bytes_fetched"] for n, p in zip(done_before, pieces)]
    assert [(p["done"], p["changed"]) for p in pieces] == [(False, True)] * (len(pieces) - 1) + [(True, True)]
    path = host.models / "m.gguf"
    assert path.read_bytes() == Path(served).read_bytes()
    assert sorted(os.listdir(host.models)) == ["m.gguf"]
    info = os.stat(path)
    entry = host.read_record()["files"][str(path)]
    assert (entry["size"], entry["mtime_ns"], entry["sha256"], entry["fetched"]) == (
        size, info.st_mtime_ns, sha(served), True)
    assert os.stat(host.record).st_mode & 0o777 == 0o640   # readable by the group, like verification.json

    again = fetch(args)
    assert server.take() == []
    assert (again["done"], again["changed"], again["fetched"], again["bytes_fetched"]) == (True, False, False, 0)


@pytest.mark.parametrize("cut, ignore_range", [
    pytest.param(2, False, id="cut-inside-the-magic"),
    pytest.param("half", False, id="cut-halfway"),
    pytest.param("half", True, id="cut-halfway-server-ignores-range"),
])
def test_a_cut_download_goes_on_from_its_part_or_starts_over_where_the_server_ignores_range(
        www, server, host, cut, ignore_range):
    served = write_model(www / "m.gguf", seed=2)[0]
    size = os.path.getsize(served)
    cut = size // 2 if cut == "half" else cut
    server.cuts["/m.gguf"] = cut
    args = host.args([server.url("m.gguf")], "m.gguf")

    first = fetch(args)
    assert (first["done"], first["bytes_fetched"]) == (False, cut)
    assert "ended at byte %d of %d" % (cut, size) in first["files"][0]["cut"]
    assert os.path.getsize(str(host.models / "m.gguf") + PART_SUFFIX) == cut
    server.ignore_range = ignore_range
    server.take()

    rest = fetch_all(args)

    gets = [r for r in server.take() if r.method == "GET"]
    assert [g.range for g in gets] == ["bytes=%d-" % cut]
    fetched = cut + sum(p["bytes_fetched"] for p in rest)
    assert fetched == (cut + size if ignore_range else size)
    assert (host.models / "m.gguf").read_bytes() == Path(served).read_bytes()
    assert sorted(os.listdir(host.models)) == ["m.gguf"]


def test_a_wrong_sha256_removes_the_part_and_leaves_the_host_as_it_was(www, server, host):
    write_model(www / "old.gguf", seed=3)
    fetch_all(host.args([server.url("old.gguf")], "old.gguf"))
    before, record_before = state(host.root), host.read_record()
    served = write_model(www / "m.gguf", seed=4)[0]
    wrong = sha(www / "old.gguf")

    with pytest.raises(FetchError) as raised:
        fetch_all(host.args([server.url("m.gguf")], "m.gguf", sha256=[wrong]))

    assert str(raised.value) == "%s: the sha256 of the %d bytes fetched is %s, not %s (llm_server_model_sha256)" % (
        server.url("m.gguf"), os.path.getsize(served), sha(served), wrong)
    assert state(host.root) == before  # no part, no m.gguf, old.gguf and the record as they were
    assert host.read_record() == record_before


@pytest.mark.parametrize("setup, url, message", [
    pytest.param(lambda s: s.missing.add("/m.gguf"), "m.gguf", "{m} answered HTTP 404 Not Found", id="404"),
    pytest.param(lambda s: s.redirects.update({"/a.gguf": "/b.gguf", "/b.gguf": "/a.gguf"}), "a.gguf",
                 "{a} redirects in a loop ({a} -> {b} -> {a})", id="redirect-loop"),
    pytest.param(lambda s: s.redirects.update({"/m.gguf": "ftp://127.0.0.1/m.gguf"}), "m.gguf",
                 "{m} redirects to ftp://127.0.0.1/m.gguf is not an http or https URL", id="redirect-to-ftp"),
    pytest.param(lambda s: s.required.update({"*": ("Authorization", "Bearer T")}), "m.gguf",
                 "{m} answered HTTP 401 Unauthorized", id="401-without-the-token"),
    pytest.param(lambda s: None, "http://127.0.0.1:{closed}/m.gguf", "http://127.0.0.1:{closed}/m.gguf cannot be reached",
                 id="nothing-listening"),
    pytest.param(lambda s: s.garbage.add("/m.gguf"), "m.gguf", "{m} cannot be reached: SSH-2.0", id="not-http"),
])
def test_an_answer_that_is_not_the_model_is_refused_and_nothing_is_written(www, server, host, setup, url, message):
    write_model(www / "m.gguf", seed=5)
    (host.models / "old.gguf").write_bytes(b"kept")
    setup(server)
    names = {"m": server.url("m.gguf"), "a": server.url("a.gguf"), "b": server.url("b.gguf"), "closed": closed_port()}
    url = url.format(**names) if url.startswith("http") else server.url(url)
    before = state(host.models)

    with pytest.raises(FetchError) as raised:
        fetch(host.args([url], "m.gguf"))

    assert str(raised.value).startswith(message.format(**names))
    assert state(host.models) == before
    assert not host.record.exists()


def _html(www):
    (www / "m.gguf").write_bytes(b"<!DOCTYPE html><html><body>Sign in to download</body></html>\n" * 20)
    return "is not a GGUF file (it starts with b'<!DOCTYPE html><'"


def _truncated(www):
    whole = Path(write_model(www / "whole.gguf", seed=6)[0]).read_bytes()
    (www / "m.gguf").write_bytes(whole[:64])
    return "is not a GGUF model: "


def _a_shard_under_a_plain_name(www):
    shutil.copy(write_model(www / "s.gguf", seed=7, split=2)[0], www / "m.gguf")
    return "split.count is 2: it is one shard of a split model"


@pytest.mark.parametrize("serve", [_html, _truncated, _a_shard_under_a_plain_name])
def test_bytes_that_are_not_a_model_are_refused_and_nothing_is_left(www, server, host, serve):
    message = serve(www)

    with pytest.raises(FetchError) as raised:
        fetch_all(host.args([server.url("m.gguf")], "m.gguf"))

    assert str(raised.value).startswith(server.url("m.gguf"))
    assert message in str(raised.value)
    assert os.listdir(host.models) == []  # neither the file nor its part
    assert not host.record.exists()


@pytest.mark.parametrize("count", [2, 3])
def test_a_split_model_comes_shard_by_shard_under_the_host_names_checked_against_sha256sums(
        www, server, host, count):
    served = write_model(www / "m.gguf", seed=8, tensors=2 * count, floats=4096, split=2)
    assert [os.path.basename(s) for s in served] == split_names("m", count)
    lines = ["%s %s%s" % (sha(s), "*" if i == 0 else " ", os.path.basename(s)) for i, s in enumerate(served)]
    (www / "SHA256SUMS").write_text("\n".join(lines) + "\n")
    args = host.args([server.url(os.path.basename(served[0]))], split_names("x", count)[0],
                     sha256=[server.url("SHA256SUMS")])

    pieces = fetch_all(args)

    assert sorted(os.listdir(host.models)) == split_names("x", count)
    for s, name in zip(served, split_names("x", count)):
        assert (host.models / name).read_bytes() == Path(s).read_bytes()
    assert sum(p["bytes_fetched"] for p in pieces) == sum(os.path.getsize(s) for s in served)
    record = host.read_record()
    assert {p: e["sha256"] for p, e in record["files"].items()} == {
        str(host.models / name): sha(s) for s, name in zip(served, split_names("x", count))}
    assert [m["files"] for m in record["models"]] == [[str(host.models / n) for n in split_names("x", count)]]
    server.take()

    again = fetch(args)
    assert (again["done"], again["changed"]) == (True, False)
    assert server.take() == []  # not even the SHA256SUMS file


def test_a_shard_missing_on_the_server_is_refused_before_any_byte_is_written(www, server, host):
    served = write_model(www / "m.gguf", seed=9, tensors=6, floats=4096, split=2)
    server.missing.add("/" + os.path.basename(served[1]))

    with pytest.raises(FetchError) as raised:
        fetch(host.args([server.url(os.path.basename(served[0]))], split_names("m", 3)[0]))

    assert str(raised.value) == "%s answered HTTP 404 Not Found" % server.url(os.path.basename(served[1]))
    assert [r.method for r in server.take()] == ["HEAD", "HEAD"]
    assert os.listdir(host.models) == []


@pytest.mark.parametrize("wrong, message", [
    pytest.param("count", "split.count is 2, but it is shard 2 of 3", id="split.count-of-another-model"),
    pytest.param("no", "split.no is 2, but it is shard 2 of 3", id="split.no-of-shard-3"),
])
def test_a_shard_whose_split_keys_disagree_with_its_place_is_refused_with_every_part_of_the_fetch(
        www, server, host, wrong, message):
    served = write_model(www / "m.gguf", seed=10, tensors=6, floats=4096, split=2)
    good_second = Path(served[1]).read_bytes()
    other = write_model(www / "other" / "o.gguf", seed=11, tensors=4, floats=4096, split=2)
    Path(served[1]).write_bytes(Path(other[1] if wrong == "count" else served[2]).read_bytes())
    names = split_names("m", 3)
    args = host.args([server.url(names[0])], names[0])

    with pytest.raises(FetchError) as raised:
        fetch_all(args)

    assert str(raised.value) == "%s: %s" % (server.url(names[1]), message)
    assert os.listdir(host.models) == []  # the model is all its shards: no part of this fetch stays
    assert not host.record.exists()

    Path(served[1]).write_bytes(good_second)  # the server is mended: the model comes whole
    pieces = fetch_all(args)
    assert sum(p["bytes_fetched"] for p in pieces) == sum(os.path.getsize(f) for f in served)
    assert sorted(os.listdir(host.models)) == names
    for name, f in zip(names, served):
        assert (host.models / name).read_bytes() == Path(f).read_bytes()


@pytest.fixture
def small_disk(tmp_path, monkeypatch):
    """A folder with 512 KiB free: a tmpfs of that size where this user may mount one (root), else the real
    folder with ``os.statvfs`` reporting 512 KiB available there (the real figures otherwise)."""
    folder = tmp_path / "small"
    folder.mkdir()
    mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(folder)], capture_output=True, check=False).returncode == 0
    if not mounted:
        real = os.statvfs

        def statvfs(path):
            info = real(path)
            if not os.path.realpath(path).startswith(str(folder)):
                return info
            return os.statvfs_result((info.f_bsize, info.f_frsize, info.f_blocks, info.f_bfree,
                                      512 * 1024 // info.f_frsize) + tuple(info)[5:])

        monkeypatch.setattr(os, "statvfs", statvfs)
    try:
        yield folder
    finally:
        if mounted:
            subprocess.run(["umount", str(folder)], check=True)


def test_a_disk_too_small_is_refused_with_the_mib_missing_and_nothing_written(www, server, host, small_disk):
    served = write_model(www / "m.gguf", seed=12, tensors=2, floats=262144)[0]
    size = os.path.getsize(served)
    info = os.statvfs(small_disk)
    free = info.f_bavail * info.f_frsize
    assert free <= 512 * 1024 < size
    args = dict(host.args([server.url("m.gguf")], "m.gguf"), path=str(small_disk / "models" / "m.gguf"))

    with pytest.raises(FetchError) as raised:
        fetch(args)

    assert str(raised.value) == ("%s has %.1f MiB free, and the model needs %.1f MiB more there: %.1f MiB missing. "
                                 "Nothing was written" % (small_disk / "models", free / MIB, size / MIB,
                                                          (size - free) / MIB))
    assert os.listdir(small_disk) == []
    assert [r.method for r in server.take()] == ["HEAD"]


@pytest.mark.parametrize("part", [0, 1000])
def test_check_mode_says_the_bytes_it_would_fetch_and_writes_nothing(www, server, host, part):
    served = write_model(www / "m.gguf", seed=13)[0]
    size = os.path.getsize(served)
    if part:
        server.cuts["/m.gguf"] = part
        fetch(host.args([server.url("m.gguf")], "m.gguf"))
    before = state(host.root)

    result = fetch(host.args([server.url("m.gguf")], "m.gguf"), check_mode=True)

    assert (result["would_fetch"], result["bytes_have"], result["done"], result["changed"]) == (
        size - part, part, False, True)
    assert state(host.root) == before
    assert [r.method for r in server.take()][-1:] == ["HEAD"]


def test_the_headers_go_to_the_first_host_and_not_after_a_redirect_to_another(www, server, host):
    served = write_model(www / "cdn" / "m.gguf", seed=14)[0]
    server.required["/m.gguf"] = ("Authorization", "Bearer T")
    server.redirects["/m.gguf"] = server.url("cdn/m.gguf", host="localhost")

    fetch_all(host.args([server.url("m.gguf")], "m.gguf", headers={"Authorization": "Bearer T"}))

    assert (host.models / "m.gguf").read_bytes() == Path(served).read_bytes()
    seen = [(r.method, r.path, r.host.split(":")[0], r.headers.get("authorization")) for r in server.take()]
    assert seen == [("HEAD", "/m.gguf", "127.0.0.1", "Bearer T"), ("HEAD", "/cdn/m.gguf", "localhost", None),
                    ("GET", "/m.gguf", "127.0.0.1", "Bearer T"), ("GET", "/cdn/m.gguf", "localhost", None)]


def test_a_host_that_refuses_head_tells_the_size_by_a_one_byte_range(www, server, host):
    served = write_model(www / "m.gguf", seed=15)[0]
    server.head_allowed = False

    pieces = fetch_all(host.args([server.url("m.gguf")], "m.gguf"))

    assert pieces[-1]["bytes_total"] == os.path.getsize(served)
    assert [(r.method, r.range) for r in server.take()] == [("HEAD", None), ("GET", "bytes=0-0"), ("GET", None)]
    assert (host.models / "m.gguf").read_bytes() == Path(served).read_bytes()


@pytest.mark.parametrize("same", [True, False], ids=["same-sha-recorded", "other-sha-refused"])
def test_a_file_already_at_the_path_is_checked_never_fetched_over(www, server, host, same):
    served = write_model(www / "m.gguf", seed=16)[0]
    there = host.models / "m.gguf"
    if same:
        shutil.copy(served, there)
    else:
        write_model(there, seed=17)
    before = state(host.models)
    args = host.args([server.url("m.gguf")], "m.gguf", sha256=[sha(served)])

    if same:
        result = fetch(args)
        assert (result["done"], result["fetched"]) == (True, False)
        info = os.stat(there)
        entry = host.read_record()["files"][str(there)]
        assert (entry["size"], entry["mtime_ns"], entry["sha256"], entry["fetched"]) == (
            os.path.getsize(served), info.st_mtime_ns, sha(served), False)
    else:
        with pytest.raises(FetchError) as raised:
            fetch(args)
        assert "%s is already there with sha256 %s, not %s" % (there, sha(there), sha(served)) in str(raised.value)
        assert not host.record.exists()
    assert server.take() == []
    assert state(host.models) == before


def test_a_recorded_file_asked_for_from_another_url_without_a_sha256_is_refused(www, server, host):
    write_model(www / "a.gguf", seed=18)
    write_model(www / "b.gguf", seed=19)
    fetch_all(host.args([server.url("a.gguf")], "m.gguf"))
    before = state(host.root)
    server.take()

    with pytest.raises(FetchError) as raised:
        fetch(host.args([server.url("b.gguf")], "m.gguf"))

    assert str(raised.value).startswith("%s holds the model fetched from %s, not %s" % (
        host.models / "m.gguf", server.url("a.gguf"), server.url("b.gguf")))
    assert server.take() == []
    assert state(host.root) == before
