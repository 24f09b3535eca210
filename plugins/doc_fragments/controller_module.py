# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The attribute of a module whose work its action plugin does on the controller:
    C(extends_documentation_fragment: [ai_llm.moe_offload.info_module, ai_llm.moe_offload.controller_module])."""

    DOCUMENTATION = r"""
options: {}
attributes:
  action:
    support: full
    description: Runs on the controller.
"""
