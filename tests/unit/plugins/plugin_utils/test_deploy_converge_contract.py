"""The whole answer of each rule of plugins/plugin_utils/_deploy_converge.py, compared as a whole: what a run does
(recreate, verify, wait) and the exact reason it gives, when a run has nothing to do, the GPU memory rows, the log
buffers expected from the plan, the verification's verdict, the cause of a failed task and the parity line."""
from __future__ import annotations

import hashlib

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_converge import (
    decide,
    describe_changes,
    failure_cause,
    log_expectations,
    parity_text,
    unchanged,
    verification_problem,
    vram_rows,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_render import (
    config_hash,
    env_block,
    env_values,
    render_compose,
)
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_values import check_settings

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


def test_each_changed_key_is_described_with_its_old_and_new_value_as_json():
    """A key the .env did not have reads as "" (its old value is None or absent), numbers stay bare."""
    changes = [{"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}, {"key": "LLM_PARALLEL", "old": None, "new": "2"},
               {"key": "LLM_PORT", "new": 8081}]
    assert describe_changes(changes) == 'LLM_CTX_SIZE "512" -> "1024", LLM_PARALLEL "" -> "2", LLM_PORT "" -> 8081'


def test_the_api_key_is_named_after_the_keys_and_only_when_it_changed():
    change = [{"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}]
    assert describe_changes(change, True) == 'LLM_CTX_SIZE "512" -> "1024", the API key'
    assert describe_changes([], key_changed=True) == "the API key"
    assert describe_changes(change) == 'LLM_CTX_SIZE "512" -> "1024"'


def test_the_compose_file_is_named_when_nothing_else_explains_the_change():
    assert describe_changes([], files=[ENV, COMPOSE]) == "the compose file"
    assert describe_changes(None, files=[COMPOSE]) == "the compose file"
    # a key or the API key already explains it
    assert describe_changes([{"key": "K", "old": "1", "new": "2"}], files=[COMPOSE]) == 'K "1" -> "2"'
    assert describe_changes([], True, [COMPOSE]) == "the API key"


def test_without_a_key_or_the_compose_file_the_configuration_files_changed():
    assert describe_changes([], files=[ENV]) == "the configuration files"
    assert describe_changes(None) == "the configuration files"
    assert describe_changes(None, files=None) == "the configuration files"


def test_a_value_is_shown_whole_up_to_60_characters_of_json_then_cut():
    """60 characters (the quotes included) are shown as they are; one more and the value ends in '...'."""
    fits, cut = "x" * 58, "y" * 59
    assert describe_changes([{"key": "K", "old": fits, "new": cut}]) == 'K "%s" -> "%s..."' % (fits, "y" * 55)
    assert len('"%s..."' % ("y" * 55)) == 60


# decide


def test_nothing_is_done_for_the_verified_configuration_that_runs_and_answers():
    for status in ("changed", "unchanged", "rolled_back"):
        assert decide(found(verification={"config_hash": H, "status": status}), written()) == NOTHING


def test_verify_always_verifies_without_a_recreate_or_a_wait():
    assert decide(found(), written(), verify_always=True) == {
        "recreate": False, "verify": True, "wait": False, "reason": ""}


def test_a_changed_key_recreates_with_the_key_in_the_reason():
    change = {"key": "LLM_CTX_SIZE", "old": "512", "new": "1024"}
    assert decide(found(), written([change])) == recreated(
        'the configuration changed (LLM_CTX_SIZE "512" -> "1024"): ai-llm is recreated')


def test_a_changed_file_recreates_even_without_a_changed_key():
    assert decide(found(), written(files=[COMPOSE])) == recreated(
        "the configuration changed (the compose file): ai-llm is recreated")
    assert decide(found(), written(files=[ENV])) == recreated(
        "the configuration changed (the configuration files): ai-llm is recreated")


def test_a_changed_api_key_recreates():
    assert decide(found(), written(), key_changed=True) == recreated(
        "the configuration changed (the API key): ai-llm is recreated")


def test_a_new_secrets_directory_or_an_entry_without_a_key_is_no_change():
    """llm_server_config lists the secrets directory when it only created it: nothing ai-llm reads changed."""
    assert decide(found(), written(files=["/srv/ai-llm/secrets"])) == NOTHING
    assert decide(found(), written(changed_keys=[{"key": ""}])) == NOTHING


def test_a_change_is_recreated_whatever_the_container_is():
    change = written(files=[COMPOSE])
    reason = "the configuration changed (the compose file): ai-llm is recreated"
    for service in (found("missing"), found("exited", exit_code=1), found(label="b" * 64), found(health=503), {}):
        assert decide(service, change) == recreated(reason)


def test_a_missing_container_is_created_under_its_name():
    assert decide(found("missing"), written()) == recreated(
        "the ai-llm container ai-llm does not exist: it is created from the configuration on disk")
    assert decide(found("missing"), written(), container_name="llm-2") == recreated(
        "the ai-llm container llm-2 does not exist: it is created from the configuration on disk")
    assert decide({}, written()) == recreated(
        "the ai-llm container ai-llm does not exist: it is created from the configuration on disk")


def test_a_container_that_does_not_run_is_recreated_with_its_status():
    """The exit code is told for an exited container only."""
    assert decide(found("exited", exit_code=137), written(), container_name="llm-2") == recreated(
        "ai-llm (llm-2) is exited (exit code 137): it is recreated with the configuration on disk")
    assert decide(found("paused"), written()) == recreated(
        "ai-llm (ai-llm) is paused: it is recreated with the configuration on disk")


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

PLACEMENT = {"pattern": r"blk\.(1|4)\.ffn_(up|down)_exps\.weight$", "tensor_overrides": [], "topology": "cpu"}
SETTINGS = check_settings({"llm_server_project_dir": "/srv/ai-llm", "llm_server_model_path": "/srv/models/demo.gguf",
                           "llm_server_image": "localhost/ai-llm:cpu", "llm_server_ctx_size": 512,
                           "llm_server_container_name": "llm-2"}).as_dict()


def on_host(settings=None, key=b"", **disk):
    """``llm_server_service_info``'s result for a host holding exactly the files of ``settings``, no lock file, the
    container running that configuration, verified and snapshotted. Returns it and the configuration hash."""
    settings = settings or SETTINGS
    values = env_values(settings, PLACEMENT)
    compose = render_compose(settings, PLACEMENT, "podman")
    digest = config_hash(values, compose, key)
    held = {"lock_file": False, "api_key_sha256": hashlib.sha256(key).hexdigest() if key else None,
            "env_settled": True, "secrets_dir": True, "leftovers": False, "model_outside_dir": None,
            "env_block": env_block(values, digest), "compose_sha256": hashlib.sha256(compose.encode()).hexdigest(),
            "verification": {"config_hash": digest, "status": "changed"}, "snapshot_hash": digest}
    held.update(disk)
    service = {"engine": "podman", "disk": held, "health": 200, "auth": {"checked": True, "enforced": True},
               "container": {"exists": True, "running": True, "status": "running", "config_hash": digest}}
    return service, digest


def proved(digest):
    return {"changed": False, "config_hash": digest, "changed_keys": [], "files_changed": [], "dropped_keys": [],
            "diff": []}


def test_nothing_to_do_without_an_api_key_by_default():
    service, digest = on_host()
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": True, "config": proved(digest),
                                                       "converge": NOTHING}
    assert unchanged(service, SETTINGS, PLACEMENT, "") == {"unchanged": True, "config": proved(digest),
                                                           "converge": NOTHING}


def test_nothing_to_do_with_the_api_key_held_on_disk():
    service, digest = on_host(key=b"sk-1\n")
    assert unchanged(service, SETTINGS, PLACEMENT, "sk-1") == {"unchanged": True, "config": proved(digest),
                                                               "converge": NOTHING}
    assert unchanged(service, SETTINGS, PLACEMENT) == {
        "unchanged": False, "reason": "the files on disk are not those of this configuration"}


def test_a_lock_file_or_no_answer_about_it_is_a_change():
    service, _digest = on_host(lock_file=True)
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": False,
                                                       "reason": "the project directory's lock file exists"}
    service, _digest = on_host()
    del service["disk"]["lock_file"]
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": False,
                                                       "reason": "the project directory's lock file exists"}
    assert unchanged(None, SETTINGS, PLACEMENT) == {"unchanged": False,
                                                    "reason": "the project directory's lock file exists"}


def test_the_container_is_named_from_the_settings():
    service, _digest = on_host()
    service["container"] = {"exists": False}
    assert unchanged(service, SETTINGS, PLACEMENT) == {
        "unchanged": False,
        "reason": "the ai-llm container llm-2 does not exist: it is created from the configuration on disk"}


def test_an_unverified_configuration_is_a_change_with_its_reason():
    service, digest = on_host(verification={"status": "failed"})
    assert unchanged(service, SETTINGS, PLACEMENT) == {
        "unchanged": False,
        "reason": "the configuration %s that ai-llm runs was never verified (an earlier run stopped before its "
                  "verification): it is verified now" % digest[:12]}


def test_verify_always_is_a_change():
    service, _digest = on_host()
    assert unchanged(service, dict(SETTINGS, verify_always=True), PLACEMENT) == {
        "unchanged": False, "reason": "a verification is asked for"}


def test_with_rollbacks_the_last_snapshot_must_be_this_configuration():
    service, digest = on_host(snapshot_hash="0" * 64)
    assert SETTINGS["rollback"] is True
    assert unchanged(service, SETTINGS, PLACEMENT) == {"unchanged": False,
                                                       "reason": "the last snapshot is not this configuration"}
    assert unchanged(service, dict(SETTINGS, rollback=False), PLACEMENT) == {
        "unchanged": True, "config": proved(digest), "converge": NOTHING}


# vram_rows


def test_each_gpu_row_compares_what_ai_llm_took_with_the_plan_without_its_margin():
    plan = {"gpus": [{"index": 0, "total_mib": 3024.4, "margin_mib": 1024}, {"index": 1, "total_mib": 1000}]}
    rows = vram_rows(["0", 1, 2], [{"index": 0, "memory_used_mib": 500}, {"index": 1, "memory_used_mib": None}],
                     [{"index": 0, "memory_used_mib": 2500}, {"index": 1, "memory_used_mib": 1000},
                      {"index": 2, "memory_used_mib": 300}], plan, 100)
    assert rows == [{"index": 0, "planned_mib": 2000, "used_mib": 2000, "ok": True},
                    {"index": 1, "planned_mib": 1000, "used_mib": 1000, "ok": True},
                    {"index": 2, "planned_mib": None, "used_mib": 300, "ok": True}]


@pytest.mark.parametrize("used, ok", [(2100, True), (2101, False), (1900, True), (1899, False), (2000, True)])
def test_a_gpu_row_is_ok_within_the_tolerance_included(used, ok):
    plan = {"gpus": [{"index": 0, "total_mib": 2500, "margin_mib": 500}]}
    assert vram_rows([0], [], [{"index": 0, "memory_used_mib": used}], plan, "100") == [
        {"index": 0, "planned_mib": 2000, "used_mib": used, "ok": ok}]


def test_without_a_plan_or_a_reading_the_rows_say_what_is_known_and_the_plan_is_rounded():
    assert vram_rows([0], None, None, None, 0) == [{"index": 0, "planned_mib": None, "used_mib": 0, "ok": True}]
    assert vram_rows(None, [], [], {}, 0) == []
    assert vram_rows([0], [], [{"index": 0, "memory_used_mib": 2001}], {"gpus": [{"index": 0, "total_mib": 2000.6}]},
                     0.5) == [{"index": 0, "planned_mib": 2001, "used_mib": 2001, "ok": True}]
    assert vram_rows([1], [{"index": 1, "memory_used_mib": 700}], [], {"gpus": [{"index": 1, "total_mib": None}]},
                     0) == [{"index": 1, "planned_mib": 0, "used_mib": -700, "ok": False}]


# log_expectations

TWO_GPUS = {
    "devices": [{"device": "CUDA0", "index": 1}, {"device": "CUDA1", "index": 0}],
    "memory": {"gpus": [{"index": 1, "model_mib": 1369.234, "kv_mib": 192.0, "recurrent_mib": 0,
                         "compute_mib": 1170.4},
                        {"index": 0, "model_mib": 800.5, "kv_mib": None, "recurrent_mib": 47.62, "compute_mib": 300.0}],
               "host": {"model_mib": 21772.0, "kv_mib": 0, "recurrent_mib": 0, "compute_mib": 40.0}},
}
ON_GPUS = {"expect_model_buffers": {"CUDA0": 1369.23, "CUDA1": 800.5}, "expect_kv_buffers": {"CUDA0": 192.0},
           "expect_rs_buffers": {"CUDA1": 47.62}, "expect_compute_buffers": {"CUDA0": 1170.4, "CUDA1": 300.0}}
NONE_EXPECTED = {"expect_model_buffers": {}, "expect_kv_buffers": {}, "expect_rs_buffers": {},
                 "expect_compute_buffers": {}}


def test_every_layer_is_offloaded_by_default():
    """The role's default -ngl offloads every layer: the plan's buffers are expected without n_gpu_layers set."""
    assert log_expectations(TWO_GPUS, "multi", {"extra_args": []}) == dict(ON_GPUS, expect_tensors=[])


@pytest.mark.parametrize("layers, expected", [("98", False), ("99", True), (" 99 ", True), ("100", True),
                                              (98, False), ("all", True), ("-1", False), ("", False)])
def test_buffers_are_expected_from_99_layers_or_all(layers, expected):
    expect = log_expectations(TWO_GPUS, "multi", {"n_gpu_layers": layers}, ("t",))
    assert expect == dict(ON_GPUS if expected else NONE_EXPECTED, expect_tensors=["t"])


def test_a_host_without_gpu_is_proved_by_its_cpu_kv_recurrent_and_compute_buffers():
    """The weights are the mapped file: no model buffer line is expected on the CPU, whatever the plan says."""
    plan = {"devices": [], "memory": {"gpus": [], "host": {"model_mib": 30.0, "kv_mib": 27.0, "recurrent_mib": 0.5,
                                                           "compute_mib": 22.77}}}
    assert log_expectations(plan, "cpu", {}) == {
        "expect_model_buffers": {}, "expect_kv_buffers": {"CPU": 27.0}, "expect_rs_buffers": {"CPU": 0.5},
        "expect_compute_buffers": {"CPU": 22.77}, "expect_tensors": None}


def test_the_cpu_topology_reads_the_host_figures_even_when_the_plan_lists_devices():
    assert log_expectations(TWO_GPUS, "cpu", {}) == dict(NONE_EXPECTED, expect_compute_buffers={"CPU": 40.0},
                                                         expect_tensors=None)


def test_a_plan_without_devices_reads_the_host_figures():
    plan = dict(TWO_GPUS, devices=[])
    assert log_expectations(plan, "single", {}, ["t"]) == dict(
        NONE_EXPECTED, expect_compute_buffers={"CPU": 40.0}, expect_tensors=["t"])


@pytest.mark.parametrize("verbosity, tensors", [("", None), (None, None), ("4", None), (4, None), ("5", ["t"]),
                                                (5, ["t"])])
def test_on_a_host_without_gpu_tensors_are_expected_from_verbosity_5(verbosity, tensors):
    expect = log_expectations(None, "cpu", {"log_verbosity": verbosity}, ["t"])
    assert expect == dict(NONE_EXPECTED, expect_tensors=tensors)
    assert log_expectations(None, "single", {"log_verbosity": verbosity}, ["t"]) == dict(
        NONE_EXPECTED, expect_tensors=["t"])


def test_no_buffers_without_a_memory_plan():
    assert log_expectations({"devices": TWO_GPUS["devices"], "memory": []}, "multi", {}) == dict(
        NONE_EXPECTED, expect_tensors=[])


# verification_problem

OK_LOG = {"verified": True, "per_tensor_lines_visible": True, "overridden": [{"tensor": "t"}]}


def test_a_load_error_is_the_first_problem():
    log = dict(OK_LOG, load_error="tensor 'x' has wrong shape", failed=True, msg="other")
    assert verification_problem(log, "p") == "the model failed to load: tensor 'x' has wrong shape"


def test_no_overridden_tensor_is_a_problem_only_for_a_pattern_with_per_tensor_lines_shown():
    nothing = dict(OK_LOG, overridden=[])
    assert verification_problem(nothing, "") == ""
    assert verification_problem(nothing, None) == ""
    assert verification_problem(dict(nothing, per_tensor_lines_visible=False), "blk") == ""
    assert verification_problem(nothing, "blk") == (
        "the pattern matched no tensors: llama-server's log shows no tensor overridden to CPU for \"blk\"")


def test_a_log_that_did_not_verify_gives_its_message():
    assert verification_problem(dict(OK_LOG, failed=True, msg="no CUDA0 buffer"), "p") == "no CUDA0 buffer"
    assert verification_problem(dict(OK_LOG, failed=True), "p") == "llama_server_log did not verify the placement"
    assert verification_problem({"verified": False}, "p") == "llama_server_log did not verify the placement"
    assert verification_problem(None, "") == "llama_server_log did not verify the placement"


def test_each_gpu_far_from_the_plan_is_named_with_the_tolerance():
    rows = [{"index": 0, "planned_mib": 2000, "used_mib": 2000, "ok": True},
            {"index": 1, "planned_mib": 1000, "used_mib": 4000, "ok": False},
            {"index": 2, "planned_mib": 500, "used_mib": 10, "ok": False}]
    text = ("GPU memory taken by ai-llm is far from the plan (tolerance %s MiB): GPU 1: 4000 MiB used, 1000 MiB "
            "planned; GPU 2: 10 MiB used, 500 MiB planned")
    assert verification_problem(OK_LOG, "p", rows) == text % 0
    assert verification_problem(OK_LOG, "p", rows, tolerance_mib=512) == text % 512
    assert verification_problem(OK_LOG, "p", rows[:1]) == ""
    assert verification_problem(OK_LOG, "p", [dict(rows[0], ok=None)]) == (
        "GPU memory taken by ai-llm is far from the plan (tolerance 0 MiB): GPU 0: 2000 MiB used, 2000 MiB planned")


def test_the_gpu_memory_is_judged_before_the_parity():
    rows = [{"index": 1, "planned_mib": 1000, "used_mib": 4000, "ok": False}]
    parity = {"before": {"tokens": [1]}, "after": {"tokens": [2]}}
    assert verification_problem(OK_LOG, "p", rows, parity).startswith("GPU memory taken by ai-llm")


def test_different_answers_before_and_after_are_a_parity_failure():
    parity = {"before": {"tokens": [1, 2], "content": "ab"}, "after": {"tokens": [1, 3], "content": "ac"}}
    assert verification_problem(OK_LOG, "p", [], parity, seed=42) == (
        "output parity failed: the same prompt (greedy, seed 42) gave [1, 2] before and [1, 3] after")
    assert verification_problem(OK_LOG, "p", parity=parity) == (
        "output parity failed: the same prompt (greedy, seed None) gave [1, 2] before and [1, 3] after")


def test_the_same_answer_or_no_baseline_is_no_parity_problem():
    same = {"tokens": [1, 2], "content": "ab"}
    assert verification_problem(OK_LOG, "p", parity={"before": same, "after": dict(same)}) == ""
    assert verification_problem(OK_LOG, "p", parity={"before": None, "after": same}) == ""
    assert verification_problem(OK_LOG, "p", parity={"before": same, "after": None}) == ""
    assert verification_problem(OK_LOG, "p", parity={}) == ""


# failure_cause


def test_a_failed_command_is_told_by_its_last_three_printed_lines():
    result = {"msg": "non-zero return code", "rc": 2, "cmd": "podman pull x", "stdout": "a\n\n  b  \nc\nd\n"}
    assert failure_cause(result) == "podman pull x failed (rc=2): b | c | d"


def test_stderr_comes_before_module_stderr_and_stdout():
    result = {"msg": "non-zero return code 125", "rc": 125, "cmd": ["podman", "run"], "stderr": "Error: e",
              "module_stderr": "m", "stdout": "o"}
    assert failure_cause(result) == "podman run failed (rc=125): Error: e"
    assert failure_cause(dict(result, stderr="")) == "podman run failed (rc=125): m"
    assert failure_cause(dict(result, stderr="", module_stderr=None)) == "podman run failed (rc=125): o"


def test_a_module_failure_is_named_by_the_task_or_as_a_command():
    result = {"msg": "MODULE FAILURE", "rc": 1, "module_stderr": "Traceback\nKeyError: 'x'\n"}
    assert failure_cause(result, {"name": "Read the host"}) == "Read the host failed (rc=1): Traceback | KeyError: 'x'"
    assert failure_cause(result) == "a command failed (rc=1): Traceback | KeyError: 'x'"
    assert failure_cause(dict(result, cmd="podman ps"), {"name": "Read"}) == (
        "podman ps failed (rc=1): Traceback | KeyError: 'x'")


def test_a_command_is_shown_up_to_120_characters():
    exact = ["p" * 59, "q" * 60]
    assert failure_cause({"rc": 1, "cmd": exact, "stderr": "boom"}) == "%s failed (rc=1): boom" % " ".join(exact)
    longer = "r" * 121
    assert failure_cause({"rc": 1, "cmd": longer, "stderr": "boom"}) == "%s... failed (rc=1): boom" % ("r" * 117)


def test_a_message_is_the_cause_without_the_roles_prefix():
    assert failure_cause({"msg": "  llm_server: refused x  ", "stderr": "ignored"}) == "refused x"
    assert failure_cause({"msg": "Could not find image", "stderr": "e", "rc": 1}) == "Could not find image"
    assert failure_cause({"msg": "say llm_server: x"}) == "say llm_server: x"


def test_a_cause_given_by_the_module_comes_first():
    assert failure_cause({"msg": "llm_server: x", "cause": "llama-server exited: boom"}) == "llama-server exited: boom"
    assert failure_cause({"msg": "non-zero return code", "stderr": "e", "cause": 7}) == "7"


def test_without_message_or_output_the_task_is_named():
    assert failure_cause({"msg": "non-zero return code", "rc": 1, "stderr": " \n"}) == "non-zero return code"
    assert failure_cause({}, {"name": "Write"}) == "the task Write failed"
    assert failure_cause(None) == "the task ? failed"
    assert failure_cause({"msg": "  "}, {}) == "the task ? failed"


# parity_text


def test_the_parity_line_is_off_unless_asked_for():
    after = {"after": {"tokens": [1], "content": "x"}}
    assert parity_text({}, after) == "off"
    assert parity_text({"parity_check": False}, after) == "off"


def test_the_parity_line_counts_the_tokens_and_shows_the_text():
    parity = {"before": {"tokens": [1, 2, 3]}, "after": {"tokens": [1, 2, 3], "content": "Hi \"you\""}}
    assert parity_text({"parity_check": True}, parity) == 'identical: 3 tokens "Hi \\"you\\""'
    assert parity_text({"parity_check": True}, {"after": {"tokens": None, "content": None, "x": 1}}) == (
        'identical: 0 tokens ""')


def test_without_an_answer_after_the_parity_line_says_why():
    assert parity_text({"parity_check": True}, None) == "no baseline (nothing served before this deploy)"
    assert parity_text({"parity_check": True}, {"before": {"tokens": [1]}}) == (
        "no baseline (nothing served before this deploy)")
    assert parity_text({"parity_check": True}, {}, "the server did not answer") == "the server did not answer"
