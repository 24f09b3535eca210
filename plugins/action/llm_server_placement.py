# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Chooses where the llm_server role puts the weights (``_deploy_placement.place``), on the controller; fails
with the reason, before anything is written, when the placement cannot be deployed."""

from __future__ import annotations

from ansible.plugins.action import ActionBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._deploy_placement import PlacementRefused, place


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        try:
            placement = place(args["settings"], args.get("model") or {}, args.get("plan"), args.get("gpus") or {},
                              args.get("missing_gpus") or [], (task_vars or {}).get("inventory_hostname", "?"))
        except PlacementRefused as exc:
            result.update(failed=True, msg=str(exc))
            return result
        result.update(changed=False, **placement)
        return result
