# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A CUDA image's ``NVIDIA_REQUIRE_CUDA``, evaluated for one GPU as NVIDIA's container hook evaluates it.

The hook (libnvidia-container, ``nvidia-container-cli configure --require``) refuses to start a container whose
requirement a visible GPU does not meet, after compose has removed the old one. The role reads the image's
requirement and checks each chosen GPU before anything stops. The semantics are libnvidia-container's
(https://github.com/NVIDIA/libnvidia-container):

- ``src/cli/dsl.c``, ``dsl_evaluate``: the expression is alternatives separated by spaces; an alternative is
  conditions separated by commas, all of which must hold; empty pieces are skipped; the first alternative that holds
  satisfies it, and an expression with no condition holds.
- ``evaluate_rule``: a condition is ``<name><operator><value>``, the operator one of ``= != < <= > >=``; the name
  (``cuda``, ``driver``, ``arch``, ``brand``) is compared without case; anything else makes the expression invalid.
- ``dsl_compare_version``: versions are digits and dots, compared number by number; trailing ``.0`` parts do not
  count (``12.8`` = ``12.8.0``); a version with another character is invalid.
- ``dsl_compare_string``: brands compare without case, ``=`` and ``!=`` only.
- ``src/cli/configure.c``, ``check_cuda_version`` / ``check_driver_version`` / ``check_device_arch`` /
  ``check_device_brand``: ``cuda`` is the CUDA version of the driver (``cuDriverGetVersion``: what nvidia-smi's
  banner prints as "CUDA Version"), ``driver`` the driver's version (``560.35.03``), ``arch`` the compute
  capability (``8.6``), ``brand`` NVML's brand of the GPU; a fact the hook cannot read satisfies its condition.

Standard library only (this file runs on the target hosts).
"""
from __future__ import annotations

import json
import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._nvidia_smi import details_args, parse_details

OPERATORS = ("=", "!=", "<", "<=", ">", ">=")
NAMES = ("cuda", "driver", "arch", "brand")
_VERSION_RE = re.compile(r"^[0-9.]*$")
_CONDITION_RE = re.compile(r"^([^<>=!]+)([<>=!]+)(.*)$")


class RequirementError(ValueError):
    """An expression libnvidia-container rejects as invalid ("invalid expression")."""


def compare_version(left, operator, right):
    """``left <operator> right`` for dotted versions, as ``dsl_compare_version``."""
    if not _VERSION_RE.match(left) or not _VERSION_RE.match(right):
        raise RequirementError("not a version: %r or %r" % (left, right))
    a = [int(p) for p in left.split(".") if p != ""]
    b = [int(p) for p in right.split(".") if p != ""]
    width = max(len(a), len(b))
    a += [0] * (width - len(a))
    b += [0] * (width - len(b))
    return {"=": a == b, "!=": a != b, "<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[operator]


def parse(expression):
    """The alternatives of an expression: a list of lists of ``(name, operator, value)``, names in lower case.
    Raises ``RequirementError`` naming the condition libnvidia-container would reject; a value that is not a
    version (``dsl_compare_version``) is refused here whether or not a GPU's fact is read, so that the image is named
    before it meets a host where it is."""
    alternatives = []
    for alternative in (expression or "").split(" "):
        conditions = []
        for condition in alternative.split(","):
            if condition == "":
                continue
            match = _CONDITION_RE.match(condition)
            if not match or match.group(2) not in OPERATORS or match.group(3) == "" \
                    or match.group(1).lower() not in NAMES:
                raise RequirementError("invalid condition %r" % condition)
            name, operator, value = match.group(1).lower(), match.group(2), match.group(3)
            if name == "brand" and operator not in ("=", "!="):
                raise RequirementError("invalid condition %r: a brand compares with = or != only" % condition)
            if name != "brand" and not _VERSION_RE.match(value):
                raise RequirementError("invalid condition %r: not a version" % condition)
            conditions.append((name, operator, value))
        if conditions:
            alternatives.append(conditions)
    return alternatives


def _holds(condition, facts):
    name, operator, value = condition
    fact = facts.get(name)
    if fact is None or fact == "":
        return True        # check_*: a fact the hook cannot read satisfies its condition
    if name == "brand":
        return (str(fact).lower() == value.lower()) == (operator == "=")
    return compare_version(str(fact), operator, value)


def satisfied(expression, facts):
    """Whether one GPU meets ``expression``. ``facts``: ``cuda`` (the driver's CUDA version), ``driver``,
    ``arch``, ``brand`` (the brand as the hook names it, ``hook_brand``: ``Tesla``, ``GeForce``, ``Unknown``...)."""
    alternatives = parse(expression)
    if not alternatives:
        return True
    return any(all(_holds(c, facts) for c in alternative) for alternative in alternatives)


def allowed_branches(expression, brand):
    """The driver branches an expression allows for ``brand`` without the ``cuda>=`` condition: the lower bound of
    each ``driver>=`` of an alternative whose brand is that brand (``['470', '535', '550', ...]``)."""
    branches = []
    for alternative in parse(expression):
        brands = [v for n, o, v in alternative if n == "brand" and o == "="]
        lows = [v for n, o, v in alternative if n == "driver" and o == ">="]
        if brands and brand and brands[0].lower() == str(brand).lower() and lows and lows[0] not in branches:
            branches.append(lows[0])
    return branches


def refusal(expression, facts, gpu_label):
    """``None`` when the GPU meets the expression, else the sentence that says why and which driver it needs."""
    if satisfied(expression, facts):
        return None
    cuda = [v for alternative in parse(expression)[:1] for n, o, v in alternative if n == "cuda" and o == ">="]
    branches = allowed_branches(expression, facts.get("brand"))
    needs = "a driver of CUDA %s or newer" % cuda[0] if cuda else "a driver that meets it"
    if branches:
        needs += " (or, for brand %s, a driver of the branch %s)" % (facts.get("brand"), ", ".join(branches))
    known = [facts.get(k) or "unknown" for k in ("driver", "cuda", "brand")]
    return ("GPU %s (driver %s, CUDA %s, brand %s) does not meet the image's NVIDIA_REQUIRE_CUDA: NVIDIA's container "
            "hook would refuse to start it; it needs %s" % tuple([gpu_label] + known + [needs]))


# The image's requirement and each GPU's facts, read on the host before anything stops.

VARIABLE = "NVIDIA_REQUIRE_CUDA"
# libnvidia-container names a GPU's brand for ``brand=`` conditions from NVML's ``nvmlDeviceGetBrand`` in
# ``src/driver.c``, ``driver_get_device_brand_1_svc``: NVML_BRAND_QUADRO "Quadro", TESLA "Tesla", NVS "NVS", GRID
# "GRID", GEFORCE "GeForce", TITAN "TITAN", and every other brand (NVIDIA_RTX, NVIDIA, QUADRO_RTX, GEFORCE_RTX, the
# virtual ones...) "Unknown". nvidia-smi prints the same NVML brand as "Product Brand" of ``nvidia-smi -q`` ("NVIDIA
# RTX" for an RTX A6000, "NVIDIA" for an H100, "GeForce" for an RTX 5090 in the captures of tests/data/nvidia_smi).
HOOK_BRANDS = {"quadro": "Quadro", "tesla": "Tesla", "nvs": "NVS", "grid": "GRID", "geforce": "GeForce",
               "titan": "TITAN"}


def hook_brand(product_brand):
    """The brand the hook compares for nvidia-smi's "Product Brand" (``None`` when nvidia-smi gave none)."""
    if not product_brand:
        return None
    return HOOK_BRANDS.get(str(product_brand).strip().lower(), "Unknown")


def image_env_args(engine, image):
    """The command that prints an image's environment (``Config.Env``) as JSON, for podman and docker alike."""
    return [engine, "image", "inspect", "--format", "{{json .Config.Env}}", image]


def parse_image_env(text):
    """``{name: value}`` of the JSON list of ``NAME=value`` that ``image_env_args`` prints; ``ValueError`` for other
    output."""
    items = json.loads(text or "null") or []
    if not isinstance(items, list):
        raise ValueError("not a list: %r" % (text or "")[:200])
    env = {}
    for item in items:
        name, sep, value = str(item).partition("=")
        if sep:
            env[name] = value
    return env


def image_requirement(run, engine, image):
    """What the image asks of the driver: ``{"image", "found", "require"}``; ``found`` false when the image is not
    on the host (compose pulls it at ``up``), ``require`` ``None`` when the image does not set the variable (a CPU
    image). ``run(argv) -> (rc, stdout, stderr)``."""
    rc, out, err = run(image_env_args(engine, image))
    if rc != 0:
        return {"image": image, "found": False, "require": None,
                "error": " ".join(((err or "") + " " + (out or "")).split())[:300]}
    try:
        env = parse_image_env(out)
    except ValueError as exc:
        return {"image": image, "found": False, "require": None,
                "error": "%s image inspect printed no environment: %s" % (engine, exc)}
    return {"image": image, "found": True, "require": env.get(VARIABLE)}


def gpu_facts(gpus, details):
    """The facts the hook checks, per GPU of ``gpu_info`` (``gpus``), from ``_nvidia_smi.parse_details`` of
    ``nvidia-smi -q`` (``details``): ``index``, ``name``, ``driver``, ``cuda``, ``arch``, ``product_brand`` (as
    nvidia-smi prints it) and ``brand`` (as the hook names it). A fact nvidia-smi does not give is ``None``."""
    by_bus = details.get("gpus") or {}
    facts = []
    for gpu in gpus:
        found = by_bus.get(str(gpu.get("pci_bus_id") or "").upper()) or {}
        facts.append({"index": gpu.get("index"), "name": gpu.get("name"),
                      "driver": gpu.get("driver_version") or details.get("driver_version"),
                      "cuda": details.get("cuda_version"), "arch": gpu.get("compute_capability"),
                      "product_brand": found.get("product_brand"), "brand": hook_brand(found.get("product_brand"))})
    return facts


def refusals(found, chosen):
    """The refusals for the GPUs ``chosen`` (indices) of ``found``, what ``llm_server_service_info`` returns as
    ``cuda_requirement``: one sentence per GPU the hook would refuse, or for a requirement it cannot parse."""
    found = found or {}
    expression = found.get("require")
    if not expression or not chosen:
        return []
    try:
        parse(expression)
    except RequirementError as exc:
        return ["the image %s sets %s=%r, which NVIDIA's container hook rejects as an invalid expression (%s)"
                % (found.get("image"), VARIABLE, expression, exc)]
    out = []
    for facts in found.get("gpus") or []:
        if facts.get("index") in chosen:
            text = refusal(expression, facts, "%s (%s)" % (facts.get("index"), facts.get("name")))
            if text:
                out.append(text)
    return out


def read(run, engine, image, gpu_info):
    """``image_requirement`` of ``image`` and, when it sets a requirement, ``gpus``: ``gpu_facts`` of the GPUs of
    ``gpu_info`` (what ``_nvidia_smi.read`` returned), from one ``nvidia-smi -q``. When that fails, the facts it
    would have given are ``None``: the hook counts a fact it cannot read as met."""
    found = image_requirement(run, engine, image)
    if found["require"] and gpu_info.get("gpus"):
        rc, out, _err = run([gpu_info.get("nvidia_smi") or "nvidia-smi"] + details_args())
        found["gpus"] = gpu_facts(gpu_info["gpus"], parse_details(out) if rc == 0 else {})
    return found
