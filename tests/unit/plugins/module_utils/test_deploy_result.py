"""llm_server_result (plugins/module_utils/_deploy_result.py): one result per host with every documented key, its
status and a one-line message, for a change, no change, a check run, a refusal, a failure and a rollback."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_result import STATUSES, build, delta_seconds

README = Path(__file__).resolve().parents[4] / "roles" / "llm_server" / "README.md"
SETTINGS = {"image": "localhost/ai-llm:cpu", "model_path": "/m/demo.gguf", "moe_offload_mode": "all",
            "base_url": "http://127.0.0.1:8080", "parity_check": False, "api_key_set": False,
            "paths": {"env": "/p/.env", "compose": "/p/c.yml", "verification": "/p/verification.json"}}
LOG = {"evidence": "per_tensor", "verified": True, "overridden": [{"tensor": "blk.1.ffn_up_exps.weight"}],
       "model_buffers": {"CPU_Mapped": 4.8}, "kv_buffers": {"CPU": 0.06}, "rs_buffers": {}, "compute_buffers": {}}


def parts(**extra):
    base = {"host": "h1", "settings": SETTINGS, "started": 100.0,
            "config": {"config_hash": "f" * 64, "changed": False},
            "placement": {"pattern": r"\.ffn_.*_exps\.weight", "pattern_source": "model", "tensor_overrides": []},
            "service": {"disk": {"verification": {"tensors_moved": ["x"], "evidence": "per_tensor"}},
                        "auth": {"checked": False}},
            "converge": {"recreate": False, "verify": False, "reason": ""}, "changes": [False]}
    base.update(extra)
    return base


def test_every_key_the_readme_documents_is_there():
    result = build(parts(), now=103.5)
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", README.read_text(), re.MULTILINE))
    assert documented and documented <= set(result), documented - set(result)
    assert set(result["timings"]) >= {"total", "recreate", "health"}
    assert set(result["files"]) == {"env", "compose", "verification"}
    assert set(result["rollback"]) == {"performed", "reason", "restored_from", "serving"}
    assert set(result["auth"]) == {"enforced", "checked"}
    assert result["timings"]["total"] == 3.5


def test_no_change_keeps_what_the_last_verification_proved():
    result = build(parts())
    assert result["status"] == "unchanged" and result["changed"] is False
    assert result["message"] == "ai-llm serves the configuration on disk (ffffffffffff); nothing to change"
    assert result["tensors_moved"] == ["x"] and result["evidence"] == "per_tensor"


def test_a_verified_recreate():
    result = build(parts(converge={"recreate": True, "verify": True, "reason": "the configuration changed (X)"},
                         log=LOG, changes=[True], timings={"commands": ["0:00:00.500000", "0:00:01.250000"]},
                         health={"seconds": 2.5, "auth": {"checked": False}}))
    assert result["status"] == "changed" and result["changed"] is True
    assert result["message"] == ("the configuration changed (X); verified: 1 tensor(s) overridden to host memory "
                                 "(per_tensor evidence)")
    assert result["tensors_moved"] == ["blk.1.ffn_up_exps.weight"]
    assert result["buffers"]["model"] == {"CPU_Mapped": 4.8}
    assert (result["timings"]["recreate"], result["timings"]["health"]) == (1.75, 2.5)


def test_check_mode_refusal_failure_and_rollback():
    checked = build(parts(check_mode=True, converge={"recreate": True, "reason": "r"}))
    assert (checked["status"], checked["message"]) == ("checked", "check mode: r (nothing was changed)")
    refused = build(parts(refusal="llm_server: refused inventory pattern"))
    assert (refused["status"], refused["message"]) == ("failed", "llm_server: refused inventory pattern")
    failed = build(parts(failure="llama-server exited: boom", rollback={"performed": False, "error": "no"}))
    assert failed["status"] == "failed"
    assert failed["message"] == "llm_server: the deploy on h1 failed: llama-server exited: boom. The rollback failed too: no"
    back = build(parts(failure="llama-server exited: boom",
                       rollback={"performed": True, "serving": True, "config_hash": "e" * 64,
                                 "reason": "Rolled back to the last verified configuration (/p/.rollback/x)",
                                 "env_keys": {"LLM_MOE_OFFLOAD_PATTERN": "blk"}}))
    assert back["status"] == "rolled_back" and back["config_hash"] == "e" * 64
    assert back["pattern"] == "blk" and back["pattern_source"] == "snapshot"
    assert back["message"].endswith("Rolled back to the last verified configuration (/p/.rollback/x); ai-llm serves "
                                    "again (http://127.0.0.1:8080/health 200).")
    assert {checked["status"], refused["status"], back["status"]} <= set(STATUSES)


def test_the_message_says_that_the_deploy_waited_for_the_lock():
    lock = {"queued": True, "msg": "waited 12 s for the lock of /p held by ansible-playbook (pid 42) on c, since t"}
    result = build(parts(lock=lock))
    assert result["message"].endswith("(waited 12 s for the lock of /p held by ansible-playbook (pid 42) on c, since t)")
    assert build(parts(lock={"queued": False, "msg": "took the lock"}))["message"].endswith("nothing to change")


@pytest.mark.parametrize("delta, seconds", [("0:00:01.234567", 1.235), ("1:02:03.5", 3723.5), ("", None),
                                            ("bad", None)])
def test_delta_seconds(delta, seconds):
    assert delta_seconds(delta) == seconds
