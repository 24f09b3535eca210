# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """The attributes of a module that only reads: C(extends_documentation_fragment: ai_llm.moe_offload.info_module)."""

    DOCUMENTATION = r"""
options: {}
attributes:
  check_mode:
    support: full
    description: The module only reads. It runs the same way in check mode.
  diff_mode:
    support: none
    description: It changes nothing, so there is no difference to show.
  idempotent:
    support: full
    description: It changes nothing. Two runs give the same result while what it reads stays the same.
"""
