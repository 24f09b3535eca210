"""The llm_server role's variables are declared once: meta/argument_specs.yml holds each one's type, choices and
default, every entry point shares those options, defaults/main.yml gives the same defaults (a templated default
compared as written), and the role's check reads that file (plugins/plugin_utils/_role_spec.py) and applies no
default of its own."""
from __future__ import annotations

import re

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._ggml import OFFLOAD_MODES
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import GOALS
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_spec import OPTIONS as READ, SECRETS, SPEC_PATH
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.role_vars import ROLE, ROLE_DEFAULTS, role_values

SPEC_TEXT = (ROLE / "meta" / "argument_specs.yml").read_text(encoding="utf-8")
ENTRY_POINTS = yaml.safe_load(SPEC_TEXT)["argument_specs"]
OPTIONS = ENTRY_POINTS["main"]["options"]


def test_the_defaults_file_has_every_variable_of_the_argument_spec_and_the_check_reads_the_roles_spec():
    """The defaults file with each one's default; the role's check reads this role's spec, where the secrets are
    the options marked no_log."""
    assert {name: option.get("default") for name, option in OPTIONS.items()} == ROLE_DEFAULTS
    assert OPTIONS["llm_server_compose_project"]["default"] == "{{ llm_server_project_dir | basename }}"
    assert SPEC_PATH.endswith("/roles/llm_server/meta/argument_specs.yml") and READ == OPTIONS
    assert SECRETS == ("llm_server_api_key", "llm_server_model_headers")


def test_every_entry_point_shares_the_one_declaration():
    assert sorted(ENTRY_POINTS) == ["main", "preflight", "rollback"]
    assert SPEC_TEXT.count("options: &llm_server_options") == 1
    assert SPEC_TEXT.count("options: *llm_server_options") == 2
    assert all(entry["options"] == OPTIONS for entry in ENTRY_POINTS.values())


def test_every_option_has_a_type_a_description_and_a_default_and_the_defaults_pass_the_spec():
    for name, option in OPTIONS.items():
        assert option.get("type") in ("str", "int", "bool", "path", "list", "float", "dict"), name
        assert option.get("description"), name
        assert "default" in option and not option.get("required"), name
        assert option["type"] != "list" or option.get("elements") in ("str", "int"), name
    spec = {name: {k: v for k, v in option.items() if k in ("type", "elements", "choices", "default")}
            for name, option in OPTIONS.items()}
    result = ArgumentSpecValidator(spec).validate(role_values(llm_server_model_path="/srv/models/x.gguf"))
    assert result.error_messages == []


@pytest.mark.parametrize("name, choices", [("llm_server_moe_offload_mode", OFFLOAD_MODES),
                                           ("llm_server_moe_offload_goal", GOALS)])
def test_the_offload_choices_are_those_the_planner_takes(name, choices):
    assert OPTIONS[name]["choices"] == list(choices)


def test_the_role_defaults_as_check_settings_gives_them_and_the_templated_ones_follow_their_variables():
    settings = check_settings(role_values(llm_server_model_path="/srv/models/x.gguf")).as_dict()
    assert settings == {
        "project_dir": "/srv/ai-llm", "compose_file": "docker-compose.prod.yml", "compose_project": "ai-llm",
        "compose_command": [], "service_name": "ai-llm", "container_name": "ai-llm", "image": "localhost/ai-llm:cuda",
        "restart_policy": "unless-stopped", "network_mode": "", "gpu_access": "auto", "bind_address": "127.0.0.1", "port": 8080,
        "container_port": 8080, "log_max_size": "50m", "log_max_file": 3, "log_verbosity": 4, "extra_args": [], "compose_template": "",
        "api_key_set": False, "allow_unauthenticated": False, "model_path": "/srv/models/x.gguf",
        "model_dir": "/srv/models", "model_mount": "/models", "container_model_path": "/models/x.gguf",
        "model_url": [], "model_sha256": [], "model_keep": 2,
        "ctx_size": 8192, "parallel": 1, "n_gpu_layers": "99", "gpu_devices": [], "moe_offload_mode": "auto",
        "moe_offload_goal": "fit",
        "cpu_expert_layers": [], "moe_offload_pattern": "", "moe_offload_force": False, "health_timeout": 300,
        "verify_always": False, "vram_check": True, "vram_tolerance_mib": 1024, "parity_check": False,
        "parity_prompt": "The capital of France is", "parity_n_predict": 16, "parity_seed": 42, "speed_check": True,
        "speed_prompt_tokens": 512, "speed_predict_tokens": 128, "speed_runs": 3, "min_decode_ratio": None,
        "min_prompt_ratio": None, "rollback": True,
        "rollback_dir": "/srv/ai-llm/.rollback", "rollback_to": "previous", "lock_timeout": 1800, "lock_lease": 3600,
        "strict_variables": False,
        "base_url": "http://127.0.0.1:8080",
        "paths": {
            "env": "/srv/ai-llm/.env", "compose": "/srv/ai-llm/docker-compose.prod.yml",
            "verification": "/srv/ai-llm/verification.json", "secrets": "/srv/ai-llm/secrets",
            "api_key": "/srv/ai-llm/secrets/api-key", "lock": "/srv/ai-llm/.llm_server.lock",
            "models": "/srv/ai-llm/.llm_server_models.json", "rollback": "/srv/ai-llm/.rollback",
        },
    }
    # the templated defaults follow the project dir and the model
    s = check_settings(role_values(llm_server_model_path="/data/gguf/m.gguf", llm_server_project_dir="/opt/llm-2"))
    assert (s.project_dir, s.compose_project, s.rollback_dir, s.model_dir) == (
        "/opt/llm-2", "llm-2", "/opt/llm-2/.rollback", "/data/gguf")


def test_the_start_command_s_defaults_are_the_roles():
    """A compose file without the role's .env (the image run by hand) starts llama-server as the role's defaults do."""
    script = (ROLE.parents[1] / "images" / "ai-llm" / "start-llama-server").read_text(encoding="utf-8")
    defaults = dict(re.findall(r'"\$\{([A-Z_]+):-([^}]*)\}"', script))
    assert defaults["CTX_SIZE"] == str(ROLE_DEFAULTS["llm_server_ctx_size"])
    assert defaults["PARALLEL"] == str(ROLE_DEFAULTS["llm_server_parallel"])
    assert defaults["N_GPU_LAYERS"] == str(ROLE_DEFAULTS["llm_server_n_gpu_layers"])
    assert defaults["LLAMA_PORT"] == str(ROLE_DEFAULTS["llm_server_port"])
