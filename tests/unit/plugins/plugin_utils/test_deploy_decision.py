"""What the llm_server role does with what it found (plugins/plugin_utils/_deploy_decision.py): recreate, verify,
wait or nothing, and the exact reason it gives, for every state a run can find; the changes described; when a run
has nothing to do at all."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import (
    decide, describe_changes, first_snapshot, next_steps, unchanged)
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.deploy_hosts import desired, holding, proved
from tests.helpers.role_vars import role_values

H = "a" * 64
RECREATE = {"recreate": True, "verify": True, "wait": True}
NOTHING = {"recreate": False, "verify": False, "wait": False, "reason": ""}
N = "c" * 64
COMPOSE = "compose"
ENV = "env"


def found(status="running", label=H, health=200, verification=None, auth=None, exit_code=0, env_hash=H):
    """``llm_server_service_info``'s result: the container, /health, the API key check, the last verification and
    the hash in .env."""
    container = {"exists": status != "missing", "running": status == "running", "status": status,
                 "config_hash": label, "exit_code": exit_code}
    return {"container": container, "health": health, "auth": auth or {"checked": True, "enforced": True},
            "disk": {"env_config_hash": env_hash,
                     "verification": {"config_hash": H, "status": "changed"} if verification is None
                     else verification}}


def written(changed_keys=(), files=(), digest=H, key_changed=False, first=False, compose_changed=None):
    """``desired_config``'s result; what compose reads changes with the compose file unless told otherwise."""
    compose_changed = COMPOSE in files if compose_changed is None else compose_changed
    return {"config_hash": digest, "changed_keys": list(changed_keys), "files": list(files), "key_changed": key_changed,
            "compose_changed": compose_changed, "first": first}


def recreated(reason):
    return dict(RECREATE, reason=reason)


# describe_changes

CTX = {"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}


@pytest.mark.parametrize("changes, key_changed, files, compose_changed, text", [
    # each key with its old and new value as JSON: a key the .env did not have reads as "", numbers stay bare
    ([CTX, {"key": "LLM_PARALLEL", "old": None, "new": "2"}, {"key": "LLM_PORT", "new": 8081}], False, (), False,
     'LLM_CTX_SIZE "512" -> "1024", LLM_PARALLEL "" -> "2", LLM_PORT "" -> 8081'),
    # the API key after the keys, and only when it changed
    ([CTX], True, (), False, 'LLM_CTX_SIZE "512" -> "1024", the API key'),
    ([], True, (), False, "the API key"),
    ([CTX], False, (), False, 'LLM_CTX_SIZE "512" -> "1024"'),
    # the compose file when what compose reads of it changed and nothing else explains the change
    ([], False, [ENV, COMPOSE], True, "the compose file"),
    (None, False, [COMPOSE], True, "the compose file"),
    ([{"key": "K", "old": "1", "new": "2"}], False, [COMPOSE], True, 'K "1" -> "2"'),
    ([], True, [COMPOSE], True, "the API key"),
    # else the configuration files: a compose file rewritten for its comments only is not named
    ([], False, [ENV, COMPOSE], False, "the configuration files"),
    ([], False, [ENV], False, "the configuration files"),
    (None, False, (), None, "the configuration files"),
    (None, False, None, None, "the configuration files"),
])
def test_describe_changes(changes, key_changed, files, compose_changed, text):
    assert describe_changes({"changed_keys": changes, "key_changed": key_changed, "files": files,
                             "compose_changed": compose_changed}) == text


def test_a_value_is_shown_whole_up_to_60_characters_of_json_then_cut():
    fits, cut = "x" * 58, "y" * 59           # 60 and 61 characters of JSON, the quotes included
    assert describe_changes({"changed_keys": [{"key": "K", "old": fits, "new": cut}]}) == 'K "%s" -> "%s..."' % (fits, "y" * 55)


# decide

CHANGED = "the configuration changed (%s): ai-llm is recreated"
CREATED = "the ai-llm container %s does not exist: it is created from the configuration on disk"
RECREATED = "ai-llm (%s) is %s: it is recreated with the configuration on disk"
OTHER_LABEL = ("ai-llm runs configuration %s but %s is on disk (an earlier run stopped before it recreated ai-llm): "
               "it is recreated")
UNVERIFIED = ("the configuration %s that ai-llm runs was never verified (an earlier run stopped before its "
              "verification): it is verified now")
NOT_IN_FORCE = {"checked": True, "enforced": False, "without_key": 200, "with_key": 401}


def verified(wait, reason=""):
    return {"recreate": False, "verify": True, "wait": wait, "reason": reason}


@pytest.mark.parametrize("service, config, options, converge", [
    # nothing for the verified configuration that runs and answers; verify_always verifies it without a recreate
    *[(found(verification={"config_hash": H, "status": status}), written(), {}, NOTHING)
      for status in ("changed", "unchanged", "rolled_back")],
    (found(), written(), {"verify_always": True}, verified(False)),
    # another hash than .env's (a changed key, file or API key) recreates with what changed
    (found(), written([CTX], digest=N), {}, recreated(CHANGED % 'LLM_CTX_SIZE "512" -> "1024"')),
    (found(), written(files=[COMPOSE], digest=N), {}, recreated(CHANGED % "the compose file")),
    (found(), written(files=[ENV], digest=N), {}, recreated(CHANGED % "the configuration files")),
    (found(), written(key_changed=True, digest=N), {}, recreated(CHANGED % "the API key")),
    # a compose file written again with the same hash for its comments only (a line rendered from the controller,
    # ansible_managed): nothing compose reads changed, nothing is recreated
    (found(), written(files=[COMPOSE], compose_changed=False), {}, NOTHING),
    (found(), written(files=[ENV, COMPOSE], compose_changed=False), {"verify_always": True}, verified(False)),
    # the same hash as .env's, but a hand edit of what compose reads of the compose file or of a key of .env's block
    # is restored and recreated
    (found(), written(files=[COMPOSE]), {}, recreated(CHANGED % "the compose file")),
    (found(), written([CTX], files=[ENV]), {}, recreated(CHANGED % 'LLM_CTX_SIZE "512" -> "1024"')),
    # a change is recreated whatever the container is
    *[(service, written(files=[COMPOSE], digest=N), {}, recreated(CHANGED % "the compose file"))
      for service in (found("missing"), found("exited", exit_code=1), found(label="b" * 64), found(health=503), {})],
    # the first deploy: no block of the role in .env yet, whatever the container is
    *[(service, written(files=[ENV, COMPOSE], first=True), {}, recreated(
        "the first deploy (.env holds no block of the role yet): ai-llm is created with this configuration"))
      for service in (found(env_hash=None), found("missing", env_hash=None), {})],
    # a container that is missing or does not run is recreated under its name (ai-llm by default)
    (found("missing"), written(), {}, recreated(CREATED % "ai-llm")),
    (found("missing"), written(), {"container_name": "llm-2"}, recreated(CREATED % "llm-2")),
    (found("missing", env_hash=None), written(digest=None), {}, recreated(CREATED % "ai-llm")),
    # the exit code is told for an exited container only
    (found("exited", exit_code=137), written(), {"container_name": "llm-2"},
     recreated(RECREATED % ("llm-2", "exited (exit code 137)"))),
    (found("paused", exit_code=1), written(), {}, recreated(RECREATED % ("ai-llm", "paused"))),
    (found("created"), written(), {}, recreated(RECREATED % ("ai-llm", "created"))),
    # a container created from another configuration, checked before the API key
    (found(label="b" * 64), written(), {}, recreated(OTHER_LABEL % ("bbbbbbbbbbbb", "aaaaaaaaaaaa"))),
    (found(label="b" * 64, auth=NOT_IN_FORCE), written(), {}, recreated(OTHER_LABEL % ("bbbbbbbbbbbb", "aaaaaaaaaaaa"))),
    (found(label=None), written(), {}, recreated(OTHER_LABEL % ("without the role's label", "aaaaaaaaaaaa"))),
    (found(label=H, env_hash=None), written(digest=None), {}, recreated(OTHER_LABEL % ("aaaaaaaaaaaa", ""))),
    # an API key not in force is recreated with what /props answered; not checked, nothing is known against it
    (found(auth=NOT_IN_FORCE), written(), {}, recreated(
        "the API key is not in force (/props answered 200 without it and 401 with it): ai-llm is recreated")),
    (found(auth={"checked": False, "enforced": False}), written(), {}, NOTHING),
    (dict(found(), auth=None), written(), {}, NOTHING),
    # a verified configuration that does not answer 200 is recreated
    *[(found(health=health), written(), {}, recreated(
        "ai-llm runs the verified configuration but /health answers %s: it is recreated" % health))
      for health in (503, None, -1)],
    # an unverified configuration is verified, and waited for only when it does not answer; without a hash, named empty
    *[row for verification in ({"config_hash": "c" * 64, "status": "changed"}, {"config_hash": H, "status": "failed"}, {})
      for row in ((found(verification=verification), written(), {}, verified(False, UNVERIFIED % "aaaaaaaaaaaa")),
                  (found(health=503, verification=verification), written(), {}, verified(True, UNVERIFIED % "aaaaaaaaaaaa")),
                  (found(verification=verification), written(), {"verify_always": True},
                   verified(False, UNVERIFIED % "aaaaaaaaaaaa")))],
    (found(label=None, verification={}, env_hash=None), written(digest=None), {}, verified(False, UNVERIFIED % "")),
])
def test_decide(service, config, options, converge):
    assert decide(service, config, **options) == converge


# unchanged

PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}
SETTINGS = check_settings(role_values({"llm_server_project_dir": "/srv/ai-llm",
                                       "llm_server_model_path": "/srv/models/demo.gguf",
                                       "llm_server_image": "localhost/ai-llm:cpu", "llm_server_ctx_size": 512,
                                       "llm_server_container_name": "llm-2"})).as_dict()


def on_host(**held):
    return holding(SETTINGS, PLACEMENT, **held)


LOCKED = "the project directory's lock file exists"


@pytest.mark.parametrize("held, settings, key, reason", [
    # nothing to do (None) for the configuration on disk that runs verified and snapshotted, with the API key held on
    # disk; without rollbacks the last snapshot does not matter
    ({}, {}, (), None), ({"key": b"sk-1\n"}, {}, ("sk-1",), None),
    ({"snapshot_hash": "0" * 64}, {"rollback": False}, (), None),
    # anything else is a change with its reason
    ({"key": b"sk-1\n"}, {}, (), "the files on disk are not those of this configuration"),
    ({"compose_sha256": "0" * 64}, {}, (), "the files on disk are not those of this configuration"),
    ({"secrets_dir": False}, {}, (), "the files on disk are not those of this configuration"),
    ({"lock_file": True}, {}, (), LOCKED),
    # the container is named from the settings
    ({"container": {"exists": False}}, {}, (),
     "the ai-llm container llm-2 does not exist: it is created from the configuration on disk"),
    ({"verification": {"status": "failed"}}, {}, (), "the configuration {digest} that ai-llm runs was never verified "
                                                     "(an earlier run stopped before its verification): it is verified now"),
    ({}, {"verify_always": True}, (), "a verification is asked for"),
    ({"snapshot_hash": "0" * 64}, {}, (), "the last snapshot is not this configuration"),    # with rollbacks, the default
])
def test_unchanged(held, settings, key, reason):
    service, digest = on_host(**held)
    assert SETTINGS["rollback"] is True
    config = desired(SETTINGS, PLACEMENT, service, *key)
    assert config == proved(digest) or reason
    assert unchanged(service, dict(SETTINGS, **settings), config) == (
        {"unchanged": True, "converge": NOTHING} if reason is None
        else {"unchanged": False, "reason": reason.format(digest=digest[:12])})


def test_no_answer_about_the_lock_file_is_a_change():
    service, digest = on_host()
    del service["disk"]["lock_file"]
    assert unchanged(service, SETTINGS, proved(digest)) == {"unchanged": False, "reason": LOCKED}
    assert unchanged(None, SETTINGS, proved(digest)) == {"unchanged": False, "reason": LOCKED}


# first_snapshot, next_steps

SERVING = {"health": 200, "container": {"config_hash": H},
           "disk": {"snapshot_hash": None, "compose_exists": True, "env_config_hash": H}}


def test_what_serves_is_kept_first_only_with_rollbacks_and_without_a_snapshot():
    on = {"rollback": True}
    assert first_snapshot(on, SERVING) is True
    assert first_snapshot(on, dict(SERVING, container={"config_hash": None})) is True
    assert first_snapshot(on, SERVING, check_mode=True) is False
    assert first_snapshot({"rollback": False}, SERVING) is False
    assert first_snapshot(on, dict(SERVING, health=503)) is False
    assert first_snapshot(on, dict(SERVING, container={"config_hash": "b" * 64})) is False
    assert first_snapshot(on, dict(SERVING, disk=dict(SERVING["disk"], snapshot_hash=H))) is False
    assert first_snapshot(on, dict(SERVING, disk=dict(SERVING["disk"], compose_exists=False))) is False


def test_after_the_writes_the_parity_verify_and_snapshot_steps():
    converge = recreated("x")
    everything = {"parity_check": True, "rollback": True}
    assert next_steps(everything, SERVING, {"config_hash": H}, converge) == {
        "parity_before": True, "verify": True, "snapshot": True, "rollback": True}
    assert next_steps(everything, SERVING, {"config_hash": H}, converge, check_mode=True) == {
        "parity_before": False, "verify": False, "snapshot": False, "rollback": False}
    assert next_steps({"rollback": True}, dict(SERVING, health=None), {"config_hash": H}, NOTHING) == {
        "parity_before": False, "verify": False, "snapshot": True, "rollback": False}
    kept = dict(SERVING, disk=dict(SERVING["disk"], snapshot_hash=H))
    assert next_steps({"rollback": True}, kept, {"config_hash": H}, NOTHING)["snapshot"] is False
    assert next_steps({"rollback": False}, SERVING, {"config_hash": H}, converge)["snapshot"] is False
    # a failure rolls back only while an unproved configuration was being verified, and only with rollbacks
    assert next_steps({"rollback": False}, SERVING, {"config_hash": H}, converge)["rollback"] is False
