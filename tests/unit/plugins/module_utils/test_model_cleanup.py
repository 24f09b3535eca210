"""The clean-up of the models the role fetched (plugins/module_utils/_model_cleanup.py): which models' files
``prune`` removes after a deploy, and the models the kept snapshots run. The models are fetched first, from a real
HTTP server on 127.0.0.1, as the role fetches them."""
from __future__ import annotations

import os
import shutil

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_files import save_snapshot
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import env_values
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._model_cleanup import prune, snapshot_models
from tests.helpers.deploy_settings import settings as deploy_settings
from tests.helpers.model_hosts import fetch_all, split_names, state, write_model
from tests.helpers.deploy_templates import render_compose, render_env


def fetch_three(www, server, host, a_there=False):
    """Models A, B (two shards) and C fetched in that order (A found already at its path with ``a_there``: checked
    and recorded, not fetched by the role); ``{name: [host files]}``."""
    models = {}
    for seed, (name, split) in enumerate([("A", 0), ("B", 1), ("C", 0)], 20):
        served = write_model(www / name / "m.gguf", seed=seed, tensors=2, floats=1024, split=split)
        names = split_names(name, 2) if split else [name + ".gguf"]
        if name == "A" and a_there:
            shutil.copy(served[0], host.models / names[0])
        fetch_all(host.args([server.url("%s/%s" % (name, os.path.basename(served[0])))], names[0]))
        models[name] = [str(host.models / n) for n in names]
    return models


def test_prune_keeps_the_models_used_last_and_removes_the_files_of_the_others(www, server, host):
    three = fetch_three(www, server, host)
    everything = state(host.models)

    assert prune(str(host.record), three["A"][0], 2) == three["B"]  # A deployed now, C the newer fetch

    assert state(host.models) == {k: v for k, v in everything.items() if not k.startswith("B-")}
    record = host.read_record()
    assert sorted(record["files"]) == three["A"] + three["C"]
    assert [m["path"] for m in record["models"]] == [three["A"][0], three["C"][0]]

    assert prune(str(host.record), three["C"][0], 1) == three["A"]  # C deployed now, A before it
    assert sorted(os.listdir(host.models)) == ["C.gguf"]


def test_keep_counts_only_the_models_the_role_fetched(www, server, host):
    """A was found at its path (not fetched) and is deployed now: B and C, both fetched, are the two kept."""
    three = fetch_three(www, server, host, a_there=True)
    everything = state(host.models)
    assert prune(str(host.record), three["A"][0], 2) == []
    assert state(host.models) == everything


@pytest.mark.parametrize("case, kept_in_record", [
    ("current", True), ("protected-by-a-snapshot", True), ("not-fetched-by-the-role", True),
    ("changed-since-recorded", False)])
def test_prune_never_removes(www, server, host, case, kept_in_record):
    """A is the oldest model and keep is 1; only its record may go, and only when its file changed."""
    three = fetch_three(www, server, host, a_there=case == "not-fetched-by-the-role")
    a = three["A"][0]
    if case == "changed-since-recorded":
        with open(a, "ab") as f:
            f.write(b"\0")
    a_before = state(host.models)["A.gguf"]

    removed = prune(str(host.record), a if case == "current" else three["C"][0], 1,
                    [a] if case == "protected-by-a-snapshot" else [])

    assert a not in removed and three["B"][0] in removed
    assert state(host.models)["A.gguf"] == a_before
    record = host.read_record()
    assert (a in record["files"], a in [m["path"] for m in record["models"]]) == (kept_in_record, kept_in_record)


CPU = {"topology": "cpu", "pattern": "", "device_overrides": [], "gpu_devices": [], "tensor_split": ""}


def role_snapshot(rollback, model_path, config_hash, inside=None, **values):
    """Keep as the last snapshot the ``.env`` and compose file the role renders for ``model_path`` (``inside``:
    the ``.env``'s LLM_MODEL_PATH changed to that)."""
    s = deploy_settings(model_path, **values)
    env = render_env(env_values(s, CPU), config_hash)
    if inside:
        env = env.replace("LLM_MODEL_PATH='%s'" % s["container_model_path"], "LLM_MODEL_PATH='%s'" % inside)
    save_snapshot(rollback, {".env": env.encode(), s["compose_file"]: render_compose(s, CPU, "podman").encode()},
                  config_hash)


def test_snapshot_models_are_the_host_paths_of_the_models_the_kept_snapshots_run(tmp_path):
    rollback = str(tmp_path / ".rollback")
    assert snapshot_models(rollback) == []
    role_snapshot(rollback, "/srv/mo dels/sub/a-00001-of-00002.gguf", "h1", llm_server_model_mount="/data")
    role_snapshot(rollback, "/srv/models/b.gguf", "h2")
    assert snapshot_models(rollback) == ["/srv/models/b.gguf", "/srv/mo dels/sub/a-00001-of-00002.gguf"]

    role_snapshot(rollback, "/srv/models/c.gguf", "h3", inside="/models2/c.gguf")  # not under the mount /models
    assert snapshot_models(rollback) == ["/srv/models/b.gguf"]
