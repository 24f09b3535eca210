"""The role fetches its model over HTTP on one local host (podman, podman-compose, the CPU image, the real
llama-server), from a real HTTP server on loopback (``tests/helpers/http_server.FileServer``), steps in order:

- the first deploy of model A (one file, its sha256 given): the server cuts the download halfway, the role says
  so and goes on with a ``Range`` request from the byte where it stopped; A is deployed and verified, and the
  result counts A's bytes once;
- the same run again sends no request to the server and changes nothing;
- model B (two shards) with a wrong sha256: refused before any change, A still serving, nothing of B left;
- model B with the URL of a ``SHA256SUMS`` file: both shards fetched, deployed and verified;
- model C, which llama-server cannot load: fetched, then rolled back to B with no request for B;
- model D in check mode: one HEAD request, the bytes it would fetch, nothing written;
- model D, from a host that wants a token (``llm_server_model_headers``, never shown), with
  ``llm_server_model_keep`` 1: after its verified deploy A and C are removed (fetched by the role, run by no
  snapshot), B stays (the previous snapshot runs it) and so does the model the role did not fetch.

Run under the podman lock: ``flock /tmp/ai-llm-podman.lock python -m pytest tests/integration/test_role_model_fetch.py``.
"""
from __future__ import annotations

import hashlib
import shutil

import pytest

from tests.helpers.http_server import FileServer
from tests.helpers.llm_deploy import local_deploy, recap, result
from tools.gguf_models import write_demo_model, write_wrong_shape

pytestmark = pytest.mark.skipif(not shutil.which("podman") or not shutil.which("podman-compose"),
                                reason="needs podman and podman-compose")


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The served models (A, B in two shards with its SHA256SUMS, C that does not load, D) and a local deploy
    whose models all live in one directory."""
    root = tmp_path_factory.mktemp("fetch")
    served = root / "served"
    served.mkdir()
    write_demo_model(served / "demo-a.gguf", seed=1)
    write_demo_model(served / "demo-b.gguf", seed=2, shards=2)
    write_wrong_shape(served / "demo-a.gguf", served / "demo-c.gguf")
    write_demo_model(served / "demo-d.gguf", seed=4)
    shards = ["demo-b-00001-of-00002.gguf", "demo-b-00002-of-00002.gguf"]
    (served / "SHA256SUMS").write_text("".join("%s  %s\n" % (sha256(served / s), s) for s in shards))
    with FileServer(served) as server, local_deploy(root, "ai-llm-fetch") as deploy:
        deploy.served, deploy.server, deploy.shards = served, server, shards
        yield deploy


def model_vars(site, name, **more):
    """The role's variables for the served model ``name`` (its first file), fetched into the deploy's models."""
    return dict({"llm_server_model_url": site.server.url(name), "llm_server_model_dir": str(site.models),
                 "llm_server_model_path": str(site.models / name)}, **more)


def deploy_run(site, **role_vars):
    """deploy.yml with ``role_vars``; its output is kept as ``run-N.log`` in the deploy's directory."""
    proc = site.playbook("deploy", **role_vars)
    output = proc.stdout + "\n" + proc.stderr
    site.runs = getattr(site, "runs", 0) + 1
    (site.root / ("run-%d.log" % site.runs)).write_text(output)
    assert recap(proc.stdout), output[-5000:]
    return {"rc": proc.returncode, "output": output, "result": result(proc.stdout) or {},
            "recap": recap(proc.stdout), "requests": site.server.take()}


@pytest.fixture(scope="module")
def first(site):
    size = (site.served / "demo-a.gguf").stat().st_size
    site.server.cuts["/demo-a.gguf"] = size // 2
    run = deploy_run(site, **model_vars(site, "demo-a.gguf", llm_server_model_sha256=sha256(site.served / "demo-a.gguf")))
    site.first_label = site.label()
    return dict(run, size=size)


def test_a_cut_download_is_resumed_from_where_it_stopped_and_the_model_deployed(site, first):
    assert first["rc"] == 0, first["output"][-5000:]
    gets = [r for r in first["requests"] if r.method == "GET" and r.path == "/demo-a.gguf"]
    assert [g.range for g in gets] == [None, "bytes=%d-" % (first["size"] // 2)]
    assert "the connection ended at byte %d of %d, resuming" % (first["size"] // 2, first["size"]) in first["output"]
    assert (site.models / "demo-a.gguf").read_bytes() == (site.served / "demo-a.gguf").read_bytes()
    fetched = first["result"]["model_fetch"]
    assert (fetched["bytes"], fetched["files"]) == (first["size"], [str(site.models / "demo-a.gguf")])
    assert first["result"]["status"] == "changed" and first["result"]["model"] == str(site.models / "demo-a.gguf")
    assert site.env_value("LLM_MODEL_PATH") == "/models/demo-a.gguf"
    assert not list(site.models.glob("*.part"))


def test_the_same_run_again_sends_no_request_and_changes_nothing(site, first):
    run = deploy_run(site, **model_vars(site, "demo-a.gguf", llm_server_model_sha256=sha256(site.served / "demo-a.gguf")))
    assert (run["rc"], run["recap"]["changed"], run["result"]["status"]) == (0, 0, "unchanged"), run["output"][-3000:]
    assert run["requests"] == []
    assert run["result"]["model_fetch"]["bytes"] == 0


def test_a_wrong_sha256_is_refused_before_any_change_and_the_old_model_serves(site, first):
    wrong = "0" * 64
    run = deploy_run(site, **model_vars(site, site.shards[0], llm_server_model_sha256=[wrong, wrong]))
    assert run["rc"] != 0
    assert "the sha256 of the %d bytes fetched is %s, not %s" % (
        (site.served / site.shards[0]).stat().st_size, sha256(site.served / site.shards[0]), wrong) in run["output"]
    assert run["result"]["status"] == "failed"
    assert (site.label(), site.health(), site.env_value("LLM_MODEL_PATH")) == (
        site.first_label, 200, "/models/demo-a.gguf")
    assert sorted(p.name for p in site.models.iterdir() if "demo-b" in p.name) == []


def test_a_split_model_checked_against_a_sha256sums_file_is_fetched_whole_and_deployed(site, first):
    run = deploy_run(site, **model_vars(site, site.shards[0], llm_server_model_sha256=site.server.url("SHA256SUMS")))
    assert run["rc"] == 0, run["output"][-5000:]
    for shard in site.shards:
        assert (site.models / shard).read_bytes() == (site.served / shard).read_bytes()
    sizes = sum((site.served / s).stat().st_size for s in site.shards)
    assert run["result"]["model_fetch"]["bytes"] == sizes
    assert run["result"]["status"] == "changed" and site.env_value("LLM_MODEL_PATH") == "/models/" + site.shards[0]
    assert sorted(r.path for r in run["requests"] if r.method == "GET") == ["/SHA256SUMS"] + [
        "/" + s for s in site.shards]


def test_a_model_that_does_not_load_rolls_back_to_the_previous_one_with_no_download(site, first):
    run = deploy_run(site, **model_vars(site, "demo-c.gguf"))
    assert run["rc"] != 0 and run["result"]["status"] == "rolled_back", run["output"][-5000:]
    assert {r.path for r in run["requests"]} == {"/demo-c.gguf"}
    assert site.health() == 200 and site.env_value("LLM_MODEL_PATH") == "/models/" + site.shards[0]


def test_check_mode_says_what_it_would_fetch_and_fetches_nothing(site, first):
    size = (site.served / "demo-d.gguf").stat().st_size
    proc = site.playbook("deploy", "--check", **model_vars(site, "demo-d.gguf"))
    assert proc.returncode == 0, proc.stdout[-5000:]
    shown = result(proc.stdout)
    assert shown["status"] == "checked" and shown["model_fetch"]["would_fetch"] == size
    assert "the model would be fetched first (%.1f MiB)" % (size / 2 ** 20) in shown["message"]
    assert [(r.method, r.path) for r in site.server.take()] == [("HEAD", "/demo-d.gguf")]
    assert not (site.models / "demo-d.gguf").exists() and not list(site.models.glob("*.part"))


def test_keep_removes_the_fetched_models_no_snapshot_runs_after_a_verified_deploy(site, first):
    """D's host wants a token: the role sends llm_server_model_headers, and no output of the run (at -v) shows it."""
    token = "Bearer tok-%s" % hashlib.sha256(b"d").hexdigest()[:16]
    site.server.required["/demo-d.gguf"] = ("Authorization", token)
    run = deploy_run(site, **model_vars(site, "demo-d.gguf", llm_server_model_keep=1,
                                        llm_server_model_headers={"Authorization": token}))
    assert run["rc"] == 0, run["output"][-5000:]
    assert token.split()[1] not in run["output"]
    assert {r.headers.get("authorization") for r in run["requests"]} == {token}
    left = sorted(p.name for p in site.models.iterdir() if p.suffix == ".gguf")
    assert left == sorted(["demo-d.gguf", "demo.gguf"] + site.shards)
