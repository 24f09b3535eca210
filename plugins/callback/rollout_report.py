# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
from __future__ import annotations

DOCUMENTATION = r"""
name: rollout_report
type: aggregate
short_description: Writes the report of an ai-llm rollout (rollout.json, rollout.md, rollout.html)
version_added: 0.1.0
author:
  - ai_llm maintainers (@ai-llm)
description:
  - Records what a rollout of the playbook C(ai_llm.moe_offload.deploy) (C(playbooks/deploy.yml)) did to every host and, when the run ends
    (completed, stopped by C(max_fail_percentage), or by a whole batch failing), writes C(rollout.json),
    C(rollout.md) and C(rollout.html) into the directory the playbook names (C(llm_rollout_report_dir)), then
    prints a short table, one line per host, after the recap.
  - It reads only what the playbook and the role publish as facts, and Ansible's own per-host outcome. The
    playbook publishes C(llm_rollout) (the report directory, the hosts, serial and max_fail_percentage) once,
    and C(llm_rollout_batch) (C(ansible_play_batch)) at the start of every serial batch; the
    C(ai_llm.moe_offload.llm_server) role publishes C(llm_server_result) on
    every host.
  - A host's status is the C(status) of its C(llm_server_result) (V(changed), V(unchanged), V(failed),
    V(rolled_back), V(checked)), V(unreachable) when Ansible lost it, V(failed) when its run ended with a failure
    outside the role, V(not_reached) when the rollout stopped before its batch.
  - Runs of other playbooks (nothing published C(llm_rollout)) write nothing.
  - In every playbook, also one without C(llm_rollout), it says the line of each host that the role's publishing
    step returns with C(llm_server_result) (C(line), with the status, the pattern, the tensors in host memory, the speed),
    after that task's banner and the host's result (the default callback prints a task's banner only with its first
    result when skipped or ok hosts are hidden, so a line said while the task runs would come before it).
requirements:
  - Enable it, in C(ansible.cfg) (C(callbacks_enabled = ai_llm.moe_offload.rollout_report)) or with
    E(ANSIBLE_CALLBACKS_ENABLED=ai_llm.moe_offload.rollout_report).
"""

import os
import tempfile
import time

from ansible import context
from ansible.plugins.callback import CallbackBase

from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_page import page
from ansible_collections.ai_llm.moe_offload.plugins.plugin_utils._rollout_report import (
    HostRun, ReportError, Rollout, build_report, markdown, one_line, table, to_json)


def _write(directory, name, text):
    """Write ``directory/name`` atomically (a temporary file renamed over it)."""
    fd, tmp = tempfile.mkstemp(prefix="." + name + ".", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(directory, name))
    except BaseException:
        os.unlink(tmp)
        raise


class CallbackModule(CallbackBase):
    """Collects ``llm_rollout``, ``llm_rollout_batch`` and ``llm_server_result`` and Ansible's per-host outcome."""

    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "aggregate"
    CALLBACK_NAME = "ai_llm.moe_offload.rollout_report"
    CALLBACK_NEEDS_ENABLED = True

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._rollout = None
        self._runs = {}
        self._phase = None
        self._start = time.time()
        self._batch_start = None

    def _run(self, host):
        return self._runs.setdefault(host, HostRun(host))

    def _facts(self, result):
        items = [result.result] + [r for r in result.result.get("results") or [] if isinstance(r, dict)]
        for item in items:
            facts = item.get("ansible_facts") or {}
            if "llm_rollout" in facts:
                self._open(facts["llm_rollout"])
            if "llm_rollout_batch" in facts and self._rollout is not None:
                self._batch(list(facts["llm_rollout_batch"] or []))
            if "llm_server_result" in facts and self._rollout is not None:
                run = self._run(result.host.get_name())
                run.result = facts["llm_server_result"]
                run.result_phase = self._phase

    def _open(self, settings):
        settings = settings if isinstance(settings, dict) else {}
        self._rollout = Rollout(
            hosts=list(settings.get("hosts") or []), report_dir=str(settings.get("report_dir") or ""),
            serial=settings.get("serial"), max_fail_percentage=settings.get("max_fail_percentage"),
            check_mode=bool(context.CLIARGS.get("check")),
            started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self._start)))
        self._runs = {}
        self._phase = "preflight"

    def _batch(self, hosts):
        now = time.time()
        self._close_batch(now)
        self._rollout.batches.append(hosts)
        self._batch_start = now
        self._phase = "deploy"
        for host in hosts:
            self._run(host).batch = len(self._rollout.batches)

    def _close_batch(self, now):
        if self._batch_start is not None:
            self._rollout.batch_seconds.append(round(now - self._batch_start, 1))
            self._batch_start = None

    def _say(self, result):
        """The host's line of the role's publishing step (its result's ``line``, next to ``llm_server_result``),
        said here, after the task's banner and its host's result, in every playbook that runs the role."""
        line = result.result.get("line")
        if isinstance(line, str) and line and "llm_server_result" in (result.result.get("ansible_facts") or {}):
            self._display.display(line)

    def v2_runner_on_ok(self, result):
        self._facts(result)
        self._say(result)

    def v2_runner_on_failed(self, result, ignore_errors=False):
        self._facts(result)
        self._say(result)
        if self._rollout is None or ignore_errors:
            return
        run = self._run(result.host.get_name())
        message = result.result.get("msg") or "task %r failed" % result.task.get_name()
        run.failure = one_line(message)
        run.failure_phase = self._phase

    def v2_runner_on_unreachable(self, result):
        if self._rollout is None or result.task.ignore_unreachable:
            return
        run = self._run(result.host.get_name())
        run.unreachable = one_line(result.result.get("msg") or "unreachable")
        run.unreachable_phase = self._phase

    def v2_playbook_on_stats(self, stats):
        if self._rollout is None or not self._rollout.report_dir:
            return
        now = time.time()
        self._close_batch(now)
        self._rollout.finished = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
        self._rollout.seconds = round(now - self._start, 1)
        # Only a failure Ansible counted ends a host's run (a failure its block rescued does not).
        for host, run in self._runs.items():
            if run.failure is not None and not stats.failures.get(host):
                run.failure = run.failure_phase = None
        try:
            report = build_report(self._rollout, list(self._runs.values()))
        except ReportError as exc:
            self._display.error("rollout report: %s" % exc)
            return
        for error in report["errors"]:
            self._display.warning("rollout report: %s" % error)
        directory = os.path.abspath(os.path.expanduser(self._rollout.report_dir))
        written = []
        try:
            os.makedirs(directory, exist_ok=True)
            for name, render in (("rollout.json", to_json), ("rollout.md", markdown), ("rollout.html", page)):
                _write(directory, name, render(report))
                written.append(name)
        except (OSError, ReportError) as exc:
            self._display.error("rollout report: %s (written: %s)" % (exc, ", ".join(written) or "nothing"))
        self._display.display("\n" + table(report))
        if written:
            self._display.display("report: %s (%s)" % (os.path.join(directory, "rollout.html"), ", ".join(written)))
