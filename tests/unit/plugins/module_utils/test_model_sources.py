"""Where a fetched model's files come from (plugins/module_utils/_model_sources.py): the URLs paired with the host
paths, the URLs as shown, and the sha256 each file must have, from a list or a SHA256SUMS file served by a real
HTTP server on 127.0.0.1 (tests/helpers/http_server.py)."""
from __future__ import annotations

import hashlib

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_fetch import get_text
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_sources import FetchError, display_url, expected_sums, sources


U = "https://models.example/repo"
SPLIT_3 = ["%s/m-%05d-of-00003.gguf" % (U, i) for i in (1, 2, 3)]
HOST_3 = ["/srv/x-%05d-of-00003.gguf" % i for i in (1, 2, 3)]


@pytest.mark.parametrize("urls, path, expected", [
    pytest.param([U + "/m.gguf"], "/srv/m.gguf", [(U + "/m.gguf", "/srv/m.gguf")], id="one-url"),
    pytest.param([SPLIT_3[0]], HOST_3[0], list(zip(SPLIT_3, HOST_3)), id="split-url-stands-for-every-shard"),
    pytest.param([U + "/a.gguf?sig=1", U + "/b.gguf"], "/srv/x-00001-of-00002.gguf",
                 [(U + "/a.gguf?sig=1", "/srv/x-00001-of-00002.gguf"), (U + "/b.gguf", "/srv/x-00002-of-00002.gguf")],
                 id="one-url-per-shard"),
    pytest.param([SPLIT_3[1]], HOST_3[0], "names shard 2 of 3: give the first shard's URL", id="shard-2-url"),
    pytest.param([SPLIT_3[0]], "/srv/x.gguf", "/srv/x.gguf must be named as the first of 3 shards", id="path-not-split"),
    pytest.param([U + "/a.gguf", U + "/b.gguf"], HOST_3[0], "must be named as the first of 2 shards",
                 id="two-urls-three-shard-path"),
    pytest.param(["ftp://models.example/m.gguf"], "/srv/m.gguf", "is not an http or https URL", id="ftp"),
    pytest.param(["http:///m.gguf"], "/srv/m.gguf", "has no host", id="no-host"),
    pytest.param(["https://hf:s3cret@models.example/m.gguf"], "/srv/m.gguf",
                 "https://models.example/m.gguf holds credentials", id="credentials"),
    pytest.param(["https://hf_s3cret@models.example/m.gguf"], "/srv/m.gguf",
                 "https://models.example/m.gguf holds credentials", id="a-token-as-the-user-name"),
    pytest.param(["http://models.example:99999/m.gguf"], "/srv/m.gguf",
                 "http://models.example has a bad port: Port out of range 0-65535", id="bad-port"),
    pytest.param(["https://hf:s3cret@models.example:x/m.gguf"], "/srv/m.gguf", "https://models.example has a bad port",
                 id="bad-port-and-credentials"),
    pytest.param([], "/srv/m.gguf", "llm_server_model_url is empty", id="empty"),
])
def test_sources_pair_each_url_with_its_host_path(urls, path, expected):
    if isinstance(expected, list):
        assert sources(urls, path) == expected
        return
    with pytest.raises(FetchError) as raised:
        sources(urls, path)
    assert expected in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_display_url_drops_the_query_and_the_credentials_and_keeps_the_port():
    assert display_url("https://u:p@models.example:8443/a/m.gguf?X-Amz-Signature=abc#f") == \
        "https://models.example:8443/a/m.gguf"


HEX = [hashlib.sha256(b"%d" % i).hexdigest() for i in range(3)]
FILES_2 = [(U + "/m-00001-of-00002.gguf", "/srv/a"), (U + "/m-00002-of-00002.gguf", "/srv/b")]


@pytest.mark.parametrize("given, expected", [
    pytest.param([], [None, None], id="none"),
    pytest.param([HEX[0].upper(), " " + HEX[1]], HEX[:2], id="hex-list"),
    pytest.param([HEX[0]], "holds 1 sha256 for the model's 2 file(s)", id="wrong-count"),
    pytest.param([HEX[0], HEX[1][:-1] + "g"], "%r is not a sha256" % (HEX[1][:-1] + "g"), id="bad-hex"),
    pytest.param(["abc"], "abc is neither a sha256 (64 hex digits) nor a SHA256SUMS URL", id="neither"),
    pytest.param(["SUMS"], HEX[:2], id="sums-url-star-and-two-space-forms"),
    pytest.param(["SUMS-SHORT"], "lists no sha256 for m-00002-of-00002.gguf", id="name-missing-from-sums"),
    pytest.param(["https://hf:s3cret@models.example/SHA256SUMS"],
                 "llm_server_model_sha256: https://models.example/SHA256SUMS holds credentials", id="sums-credentials"),
    pytest.param(["ftp://models.example/SHA256SUMS"], "ftp://models.example/SHA256SUMS is not an http or https URL",
                 id="sums-ftp"),
])
def test_expected_sums(www, server, given, expected):
    (www / "SUMS").write_text("%s *m-00001-of-00002.gguf\n%s  ./m-00002-of-00002.gguf\n%s  other.gguf\n" % tuple(HEX))
    (www / "SUMS-SHORT").write_text("%s *m-00001-of-00002.gguf\n" % HEX[0])
    given = [server.url(g) if g.startswith("SUMS") else g for g in given]
    fetched = []

    def read(url):
        fetched.append(url)
        return get_text(url)

    if isinstance(expected, list):
        assert expected_sums(given, FILES_2, read) == expected
    else:
        with pytest.raises(FetchError) as raised:
            expected_sums(given, FILES_2, read)
        assert expected in str(raised.value)
        assert "s3cret" not in str(raised.value)
    assert fetched == [g for g in given if g.startswith(server.url(""))]  # a SHA256SUMS of the server, read once
