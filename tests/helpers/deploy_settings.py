"""What the deploy steps of the llm_server role are tested on: the role's settings as ``check_settings`` returns them
for a model, and the demo model of tools/gguf_models with its routed expert tensors."""
from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._role_variables import check_settings
from tests.helpers.role_vars import role_values
from tools.gguf_models import write_demo_model

EXPERTS = ["blk.1.ffn_down_exps.weight", "blk.1.ffn_up_exps.weight", "blk.4.ffn_down_exps.weight",
           "blk.4.ffn_up_exps.weight"]


def demo_model(tmp_path_factory):
    """The demo model, written once per test module (a ``demo`` fixture of module scope)."""
    return write_demo_model(str(tmp_path_factory.mktemp("m") / "demo.gguf"))


def settings(model, **values):
    """The checked settings: the role's defaults, the model, compose project x, a 512-token context, ``values``."""
    return check_settings(role_values({"llm_server_model_path": model, "llm_server_compose_project": "x",
                                       "llm_server_ctx_size": 512}, **values)).as_dict()
