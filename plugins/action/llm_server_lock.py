# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The lock of the llm_server role's project directory, on the controller: names the owner (this
``ansible-playbook``), asks ``llm_server_lock_file`` on the host, waits while another deploy holds the lock, and
proves a killed owner on this controller dead so that its lock is taken over."""

from __future__ import annotations

import os
import socket
import time

from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._deploy_lock import (
    boot_id,
    describe,
    owner_is_dead,
    process_start,
)

display = Display()
POLL_SECONDS = 1.0


def controller_owner():
    """This controller's ``ansible-playbook`` process (the parent of the forked worker running this plugin)."""
    pid = os.getppid()
    return {"controller": socket.gethostname(), "boot_id": boot_id(), "pid": pid, "pid_start": process_start(pid),
            "user": os.environ.get("USER") or str(os.getuid())}


def same_run(holder_owner, owner):
    """Whether a lock belongs to this very ansible-playbook process (another host of the same run)."""
    keys = ("controller", "boot_id", "pid", "pid_start")
    return bool(holder_owner) and all(holder_owner.get(k) == owner.get(k) for k in keys)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = True

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        _checked, given = self.validate_argument_spec(argument_spec={
            "settings": {"type": "dict", "required": True},
            "state": {"type": "str", "choices": ["acquired", "released"], "default": "acquired"},
            "token": {"type": "str", "no_log": False}})
        settings = given["settings"]
        args = {"path": settings["paths"]["lock"], "lease": settings["lock_lease"]}
        if given["state"] == "released":
            result.update(self._execute_module("ai_llm.moe_offload.llm_server_lock_file", task_vars=task_vars,
                                               module_args=dict(args, state="released", token=given["token"])))
            return result
        timeout = int(settings["lock_timeout"])
        owner = controller_owner()
        start = time.monotonic()
        takeover, waited_for, announced = None, None, False
        while True:
            answer = self._execute_module("ai_llm.moe_offload.llm_server_lock_file",
                                          module_args=dict(args, owner=owner, takeover=takeover),
                                          task_vars=task_vars)
            if answer.get("failed"):
                result.update(answer)
                return result
            if answer.get("acquired"):
                break
            holder = answer.get("holder") or {}
            if same_run(holder.get("owner"), owner):
                result.update(failed=True, acquired=False,
                              msg="llm_server: the lock %s is held by this same ansible-playbook run (pid %s): two "
                                  "inventory hosts deploy into one project directory of one machine; give each its "
                                  "own llm_server_project_dir" % (args.get("path"), owner["pid"]))
                return result
            if owner_is_dead(holder.get("owner"), owner["controller"], owner["boot_id"]):
                takeover = holder.get("token")
                continue
            waited_for = describe(holder)
            if time.monotonic() - start >= timeout:
                result.update(failed=True, acquired=False, waited=round(time.monotonic() - start, 1),
                              waited_for=waited_for,
                              msg="llm_server: waited %d s for the lock %s, still held by %s; its lease runs until "
                                  "%s (llm_server_lock_timeout, llm_server_lock_lease)"
                                  % (timeout, args.get("path"), waited_for,
                                     time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("lease_until", 0)))))
                return result
            if not announced:
                display.display("%s: another deploy holds %s: waiting for %s"
                                % (task_vars.get("inventory_hostname", "?"), args.get("path"), waited_for))
                announced = True
            time.sleep(POLL_SECONDS)
        waited = round(time.monotonic() - start, 1)
        parts = []
        if waited_for:
            parts.append("waited %.0f s for the lock of %s held by %s" % (waited, os.path.dirname(args["path"]),
                                                                          waited_for))
        if answer.get("took_over"):
            parts.append("took over the lock left by %s" % answer["took_over"])
        result.update(answer)
        result.update(waited=waited, waited_for=waited_for, queued=bool(parts),
                      msg="; ".join(parts) or "took the lock %s" % args.get("path"))
        result.pop("holder", None)
        result.pop("holder_text", None)
        return result
