# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The O(settings) option of the role's actions that check the variables or take them checked:
    C(extends_documentation_fragment: ai_llm.moe_offload.checked_settings)."""

    DOCUMENTATION = r"""
options:
  settings:
    description:
      - Settings checked earlier in the same run (RV(settings) of an earlier call); given, the variables are not
        checked again. The role reads the host a second time under the lock this way.
    type: dict
"""
