# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import annotations


class ModuleDocFragment:
    """What the lock action and the host module it calls share: O(state), O(token) and the attributes of a lock:
    C(extends_documentation_fragment: ai_llm.moe_offload.lock)."""

    DOCUMENTATION = r"""
options:
  state:
    description: V(acquired) takes the lock, V(released) gives it back.
    type: str
    choices: [acquired, released]
    default: acquired
  token:
    description: With O(state=released), the token RV(token) of the acquiring task.
    type: str
attributes:
  check_mode:
    support: none
    description: Check mode runs take no lock; the role skips the lock in check mode.
  diff_mode:
    support: none
    description: There is nothing to show.
  idempotent:
    support: none
    description: Every acquisition writes a new token.
"""
