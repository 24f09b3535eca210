"""What the llm_server role does with what it found (plugins/plugin_utils/_deploy_decision.py): recreate, verify,
wait or nothing, and the exact reason it gives, for every state a run can find; the changes described; when a run
has nothing to do at all."""
from __future__ import annotations

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_decision import (
    decide,
    describe_changes,
    first_snapshot,
    next_steps,
    return_due,
    unchanged,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings
from tests.helpers.deploy_hosts import holding, proved
from tests.helpers.role_vars import role_values

H = "a" * 64
RECREATE = {"recreate": True, "verify": True, "wait": True}
NOTHING = {"recreate": False, "verify": False, "wait": False, "reason": ""}
COMPOSE = "/srv/ai-llm/docker-compose.prod.yml"
ENV = "/srv/ai-llm/.env"


def found(status="running", label=H, health=200, verification=None, auth=None, exit_code=0):
    """``llm_server_service_info``'s result: the container, /health, the API key check and the last verification."""
    container = {"exists": status != "missing", "running": status == "running", "status": status,
                 "config_hash": label, "exit_code": exit_code}
    return {"container": container, "health": health, "auth": auth or {"checked": True, "enforced": True},
            "disk": {"verification": {"config_hash": H, "status": "changed"} if verification is None
                     else verification}}


def written(changed_keys=(), files=(), digest=H):
    """``llm_server_config``'s result."""
    return {"config_hash": digest, "changed_keys": list(changed_keys), "files_changed": list(files)}


def recreated(reason):
    return dict(RECREATE, reason=reason)


# describe_changes

CTX = {"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}


@pytest.mark.parametrize("changes, key_changed, files, text", [
    # each key with its old and new value as JSON: a key the .env did not have reads as "", numbers stay bare
    ([CTX, {"key": "LLM_PARALLEL", "old": None, "new": "2"}, {"key": "LLM_PORT", "new": 8081}], False, (),
     'LLM_CTX_SIZE "512" -> "1024", LLM_PARALLEL "" -> "2", LLM_PORT "" -> 8081'),
    # the API key after the keys, and only when it changed
    ([CTX], True, (), 'LLM_CTX_SIZE "512" -> "1024", the API key'),
    ([], True, (), "the API key"),
    ([CTX], False, (), 'LLM_CTX_SIZE "512" -> "1024"'),
    # the compose file when nothing else explains the change
    ([], False, [ENV, COMPOSE], "the compose file"),
    (None, False, [COMPOSE], "the compose file"),
    ([{"key": "K", "old": "1", "new": "2"}], False, [COMPOSE], 'K "1" -> "2"'),
    ([], True, [COMPOSE], "the API key"),
    # else the configuration files
    ([], False, [ENV], "the configuration files"),
    (None, False, (), "the configuration files"),
    (None, False, None, "the configuration files"),
])
def test_describe_changes(changes, key_changed, files, text):
    assert describe_changes(changes, key_changed, files) == text


def test_a_value_is_shown_whole_up_to_60_characters_of_json_then_cut():
    """60 characters (the quotes included) are shown as they are; one more and the value ends in '...'."""
    fits, cut = "x" * 58, "y" * 59
    assert describe_changes([{"key": "K", "old": fits, "new": cut}]) == 'K "%s" -> "%s..."' % (fits, "y" * 55)


# decide


def test_nothing_is_done_for_the_verified_configuration_that_runs_and_answers():
    for status in ("changed", "unchanged", "rolled_back"):
        assert decide(found(verification={"config_hash": H, "status": status}), written()) == NOTHING


def test_verify_always_verifies_without_a_recreate_or_a_wait():
    assert decide(found(), written(), verify_always=True) == {
        "recreate": False, "verify": True, "wait": False, "reason": ""}


@pytest.mark.parametrize("config, key_changed, converge", [
    (written([{"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}]), False,
     recreated('the configuration changed (LLM_CTX_SIZE "512" -> "1024"): ai-llm is recreated')),
    (written(files=[COMPOSE]), False, recreated("the configuration changed (the compose file): ai-llm is recreated")),
    (written(files=[ENV]), False, recreated("the configuration changed (the configuration files): ai-llm is recreated")),
    (written(), True, recreated("the configuration changed (the API key): ai-llm is recreated")),
    # llm_server_config lists the secrets directory when it only created it: nothing ai-llm reads changed
    (written(files=["/srv/ai-llm/secrets"]), False, NOTHING),
    (written(changed_keys=[{"key": ""}]), False, NOTHING),
])
def test_a_changed_key_file_or_api_key_recreates_with_what_changed(config, key_changed, converge):
    assert decide(found(), config, key_changed=key_changed) == converge


def test_a_change_is_recreated_whatever_the_container_is():
    change = written(files=[COMPOSE])
    reason = "the configuration changed (the compose file): ai-llm is recreated"
    for service in (found("missing"), found("exited", exit_code=1), found(label="b" * 64), found(health=503), {}):
        assert decide(service, change) == recreated(reason)


CREATED = "the ai-llm container %s does not exist: it is created from the configuration on disk"


@pytest.mark.parametrize("service, name, reason", [
    (found("missing"), None, CREATED % "ai-llm"),
    (found("missing"), "llm-2", CREATED % "llm-2"),
    ({}, None, CREATED % "ai-llm"),
    # the exit code is told for an exited container only
    (found("exited", exit_code=137), "llm-2",
     "ai-llm (llm-2) is exited (exit code 137): it is recreated with the configuration on disk"),
    (found("paused", exit_code=1), None, "ai-llm (ai-llm) is paused: it is recreated with the configuration on disk"),
    (found("created"), None, "ai-llm (ai-llm) is created: it is recreated with the configuration on disk"),
])
def test_a_container_that_is_missing_or_does_not_run_is_recreated_under_its_name(service, name, reason):
    named = {"container_name": name} if name else {}      # None: the default name
    assert decide(service, written(), **named) == recreated(reason)


def test_a_container_created_from_another_configuration_is_recreated():
    assert decide(found(label="b" * 64), written()) == recreated(
        "ai-llm runs configuration bbbbbbbbbbbb but aaaaaaaaaaaa is on disk (an earlier run stopped before it "
        "recreated ai-llm): it is recreated")
    assert decide(found(label=None), written()) == recreated(
        "ai-llm runs configuration without the role's label but aaaaaaaaaaaa is on disk (an earlier run stopped "
        "before it recreated ai-llm): it is recreated")
    assert decide(found(label=H), written(digest=None)) == recreated(
        "ai-llm runs configuration aaaaaaaaaaaa but  is on disk (an earlier run stopped before it "
        "recreated ai-llm): it is recreated")


def test_an_api_key_not_in_force_is_recreated_with_what_props_answered():
    auth = {"checked": True, "enforced": False, "without_key": 200, "with_key": 401}
    assert decide(found(auth=auth), written()) == recreated(
        "the API key is not in force (/props answered 200 without it and 401 with it): ai-llm is recreated")
    # not checked: nothing is known against it
    assert decide(found(auth={"checked": False, "enforced": False}), written()) == NOTHING
    assert decide(dict(found(), auth=None), written()) == NOTHING


def test_the_label_is_checked_before_the_api_key():
    auth = {"checked": True, "enforced": False, "without_key": 200, "with_key": 200}
    assert decide(found(label="b" * 64, auth=auth), written())["reason"].startswith(
        "ai-llm runs configuration bbbbbbbbbbbb")


def test_a_verified_configuration_that_does_not_answer_200_is_recreated():
    for health in (503, None, -1):
        assert decide(found(health=health), written()) == recreated(
            "ai-llm runs the verified configuration but /health answers %s: it is recreated" % health)


def test_an_unverified_configuration_is_verified_and_waited_for_only_when_it_does_not_answer():
    reason = ("the configuration aaaaaaaaaaaa that ai-llm runs was never verified (an earlier run stopped before its "
              "verification): it is verified now")
    for verification in ({"config_hash": "c" * 64, "status": "changed"}, {"config_hash": H, "status": "failed"}, {}):
        assert decide(found(verification=verification), written()) == {
            "recreate": False, "verify": True, "wait": False, "reason": reason}
        assert decide(found(health=503, verification=verification), written()) == {
            "recreate": False, "verify": True, "wait": True, "reason": reason}
        assert decide(found(verification=verification), written(), verify_always=True)["reason"] == reason


def test_an_unverified_configuration_without_a_hash_is_named_empty():
    service = found(label=None, verification={})
    assert decide(service, written(digest=None)) == {
        "recreate": False, "verify": True, "wait": False,
        "reason": "the configuration  that ai-llm runs was never verified (an earlier run stopped before its "
                  "verification): it is verified now"}


# unchanged

PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "device_overrides": [], "topology": "cpu"}
SETTINGS = check_settings(role_values({"llm_server_project_dir": "/srv/ai-llm",
                                       "llm_server_model_path": "/srv/models/demo.gguf",
                                       "llm_server_image": "localhost/ai-llm:cpu", "llm_server_ctx_size": 512,
                                       "llm_server_container_name": "llm-2"})).as_dict()


def on_host(**held):
    return holding(SETTINGS, PLACEMENT, **held)


def test_nothing_to_do_for_the_configuration_on_disk_that_runs_verified_and_snapshotted():
    service, digest = on_host()
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": True, "config": proved(digest),
                                                       "converge": NOTHING}
    # without rollbacks the last snapshot does not matter
    service, digest = on_host(snapshot_hash="0" * 64)
    assert unchanged(service, dict(SETTINGS, rollback=False), PLACEMENT) == {
        "unchanged": True, "config": proved(digest), "converge": NOTHING}


def test_nothing_to_do_with_the_api_key_held_on_disk():
    service, digest = on_host(key=b"sk-1\n")
    assert unchanged(service, SETTINGS, PLACEMENT, "sk-1") == {"unchanged": True, "config": proved(digest),
                                                               "converge": NOTHING}
    assert unchanged(service, SETTINGS, PLACEMENT) == {
        "unchanged": False, "reason": "the files on disk are not those of this configuration"}


LOCKED = "the project directory's lock file exists"


@pytest.mark.parametrize("held, settings, reason", [
    ({"lock_file": True}, {}, LOCKED),
    # the container is named from the settings
    ({"container": {"exists": False}}, {},
     "the ai-llm container llm-2 does not exist: it is created from the configuration on disk"),
    ({"verification": {"status": "failed"}}, {}, "the configuration {digest} that ai-llm runs was never verified (an "
                                                 "earlier run stopped before its verification): it is verified now"),
    ({}, {"verify_always": True}, "a verification is asked for"),
    ({"snapshot_hash": "0" * 64}, {}, "the last snapshot is not this configuration"),    # with rollbacks, the default
])
def test_anything_else_is_a_change_with_its_reason(held, settings, reason):
    service, digest = on_host(**held)
    assert SETTINGS["rollback"] is True
    assert unchanged(service, dict(SETTINGS, **settings), PLACEMENT) == {
        "unchanged": False, "reason": reason.format(digest=digest[:12])}


def test_no_answer_about_the_lock_file_is_a_change():
    service, _digest = on_host()
    del service["disk"]["lock_file"]
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": False, "reason": LOCKED}
    assert unchanged(None, SETTINGS, PLACEMENT) == {"unchanged": False, "reason": LOCKED}


# first_snapshot, next_steps, return_due

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
        "parity_before": True, "verify": True, "snapshot": True}
    assert next_steps(everything, SERVING, {"config_hash": H}, converge, check_mode=True) == {
        "parity_before": False, "verify": False, "snapshot": False}
    assert next_steps({"rollback": True}, dict(SERVING, health=None), {"config_hash": H}, NOTHING) == {
        "parity_before": False, "verify": False, "snapshot": True}
    kept = dict(SERVING, disk=dict(SERVING["disk"], snapshot_hash=H))
    assert next_steps({"rollback": True}, kept, {"config_hash": H}, NOTHING)["snapshot"] is False
    assert next_steps({"rollback": False}, SERVING, {"config_hash": H}, converge)["snapshot"] is False


def test_a_failure_returns_only_while_an_unproved_configuration_was_being_verified():
    assert return_due(recreated("x"), verified=False) is True
    assert return_due(recreated("x"), verified=True) is False
    assert return_due(recreated("x"), verified=False, check_mode=True) is False
    assert return_due(NOTHING, verified=False) is False
    assert return_due(None, verified=False) is False
