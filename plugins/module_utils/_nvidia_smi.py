# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What ``nvidia-smi`` says about the GPUs of a host: the arguments to run it with and the parsers
of its CSV output.

Standard library only: this runs on target hosts. Nothing here runs a process: the caller runs
``nvidia-smi`` (``read`` takes the function that does) and hands the text to these functions, so that they are
tested on the exact output real cards print.
"""

from __future__ import annotations

import csv
import re

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._host_memory import process_tree

# The fields of the GPU query and the key ``gpu_info`` returns for each, in order.
GPU_QUERY = (("index", "index"), ("name", "name"), ("uuid", "uuid"), ("pci.bus_id", "pci_bus_id"),
             ("memory.total", "memory_total_mib"), ("memory.used", "memory_used_mib"),
             ("memory.free", "memory_free_mib"), ("driver_version", "driver_version"),
             ("compute_cap", "compute_capability"))
GPU_FIELDS = tuple(f for f, _k in GPU_QUERY)
GPU_KEYS = tuple(k for _f, k in GPU_QUERY)
_KEY_OF = dict(GPU_QUERY)
_INT_KEYS = ("index", "memory_total_mib", "memory_used_mib", "memory_free_mib")
# What gpu_info adds to each GPU: its MIG mode and MIG devices and, with a pid, the memory that process tree holds on it.
GPU_EXTRA_KEYS = ("mig_mode", "mig_devices", "memory_held_by_pid_mib")
# The MIG mode of each GPU, asked apart from GPU_QUERY: ``mig.mode.current`` prints "Enabled" or "Disabled", and
# "[N/A]" on a GPU without MIG (nvidia-smi(1) of driver 550, "MIG Mode":
# https://manpages.ubuntu.com/manpages/plucky/man1/nvidia-smi.1.html; the query as NVIDIA's own projects use it:
# https://github.com/NVIDIA/gpu-operator/issues/132). A driver that
# does not know the field (before R450, the first with MIG) fails the query: the mode is then unknown (``None``).
MIG_QUERY = ("uuid", "mig.mode.current")
MIG_ENABLED = "Enabled"

APP_QUERY = (("gpu_uuid", "gpu_uuid"), ("pid", "pid"), ("process_name", "process_name"),
             ("used_memory", "used_memory_mib"))
APP_FIELDS = tuple(f for f, _k in APP_QUERY)
APP_KEYS = tuple(k for _f, k in APP_QUERY)

# What nvidia-smi prints instead of a value it cannot give.
UNAVAILABLE = ("[N/A]", "N/A", "[Not Supported]", "Not Supported", "[Unknown Error]", "[Insufficient Permissions]",
               "[Not Found]", "[GPU requires reset]", "[GPU is lost]")

# Failures nvidia-smi reports in words (and a non-zero exit code): the first line is the message.
_KNOWN_FAILURES = (
    ("Failed to initialize NVML", "the NVIDIA kernel driver and the user-space NVML library differ "
     "(typically after a driver upgrade without a reboot): reboot or reload the nvidia kernel modules"),
    ("couldn't communicate with the NVIDIA driver", "the NVIDIA kernel driver is not loaded: install it "
     "or load the nvidia kernel module"),
    ("No devices were found", "the driver is loaded but sees no GPU"),
    ("Unable to determine the device handle", "a GPU is in a bad state (fallen off the bus?): see dmesg"),
)
_INVALID_FIELD_RE = re.compile(r'Field "([^"]+)" is not a valid field to query')
_MIG_LINE_RE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s+\(UUID:\s*(MIG-[^)]+)\)")
_GPU_LINE_RE = re.compile(r"^GPU\s+(\d+):\s+(.*?)\s+\(UUID:\s*(GPU-[^)]+)\)")


class NvidiaSmiError(Exception):
    """nvidia-smi ran but did not give what was asked; ``str()`` is a message for people, ``binary`` the program
    (when known)."""

    def __init__(self, message, binary=None):
        super().__init__(message)
        self.binary = binary


def query_gpu_args(fields=GPU_FIELDS):
    """The arguments (without the program) of the GPU query."""
    return ["--query-gpu=" + ",".join(fields), "--format=csv,noheader,nounits"]


def query_apps_args():
    """The arguments (without the program) of the per-process memory query."""
    return ["--query-compute-apps=" + ",".join(APP_FIELDS), "--format=csv,noheader,nounits"]


def query_mig_args():
    """The arguments (without the program) of the MIG mode query."""
    return ["--query-gpu=" + ",".join(MIG_QUERY), "--format=csv,noheader,nounits"]


def list_args():
    """The arguments of ``nvidia-smi -L`` (GPUs and their MIG devices)."""
    return ["-L"]


def invalid_field(text):
    """The field an older driver rejects (``compute_cap`` before driver 510), or ``None``."""
    match = _INVALID_FIELD_RE.search(text or "")
    return match.group(1) if match else None


def failure_message(rc, stdout, stderr):
    """A message for people when nvidia-smi failed, with nvidia-smi's own words; ``None`` when it did not."""
    text = "\n".join(part.strip() for part in (stdout or "", stderr or "") if part and part.strip())
    if rc == 0 and not any(failure[0] in text for failure in _KNOWN_FAILURES):
        return None
    words = " / ".join(line.strip() for line in text.splitlines() if line.strip()) or "no output"
    for marker, meaning in _KNOWN_FAILURES:
        if marker in text:
            return "nvidia-smi failed (rc=%s): %s. This means %s." % (rc, words, meaning)
    return "nvidia-smi failed (rc=%s): %s" % (rc, words)


def _value(raw):
    raw = raw.strip()
    if raw in UNAVAILABLE or raw == "":
        return None
    return raw


def _rows(text):
    lines = [line for line in (text or "").splitlines() if line.strip()]
    return list(csv.reader(lines, skipinitialspace=True))


def parse_gpus(text, fields=GPU_FIELDS):
    """Parse the output of the GPU query.

    Returns ``(gpus, warnings)``: ``gpus`` a list of dicts with the keys of GPU_KEYS (``None`` where
    nvidia-smi printed ``[N/A]``/``[Not Supported]`` or the field was not queried), ``warnings`` a list
    of str. Raises ``NvidiaSmiError`` for output that is not the CSV asked for.
    """
    keys = [_KEY_OF[f] for f in fields]
    gpus = []
    warnings = []
    for number, row in enumerate(_rows(text), 1):
        if len(row) != len(fields):
            raise NvidiaSmiError("nvidia-smi printed an unexpected line %d (expected %d comma-separated fields "
                                 "%s): %r" % (number, len(fields), ",".join(fields), ", ".join(row)))
        gpu = dict((k, None) for k in GPU_KEYS)
        for key, raw in zip(keys, row):
            value = _value(raw)
            if value is not None and key in _INT_KEYS:
                try:
                    value = int(float(value))
                except ValueError:
                    raise NvidiaSmiError("nvidia-smi printed %r for %s on line %d: not a number" % (raw, key, number))
            gpu[key] = value
        missing = [k for k, raw in zip(keys, row) if _value(raw) is None]
        if missing:
            warnings.append("GPU %s (%s): nvidia-smi gives no value for %s (%s)" % (
                gpu["index"], gpu["name"], ", ".join(missing),
                ", ".join(sorted(set(raw.strip() for k, raw in zip(keys, row) if k in missing)))))
        gpus.append(gpu)
    return gpus, warnings


def parse_apps(text, gpus=()):
    """Parse the output of the per-process query into a list of dicts (APP_KEYS plus ``gpu_index``)."""
    by_uuid = dict((g.get("uuid"), g.get("index")) for g in gpus)
    apps = []
    for row in _rows(text):
        if len(row) == 1 and "No running" in row[0]:  # old drivers say so instead of printing nothing
            continue
        if len(row) != len(APP_FIELDS):
            raise NvidiaSmiError("nvidia-smi printed an unexpected process line: %r" % ", ".join(row))
        app = dict(zip(APP_KEYS, (_value(raw) for raw in row)))
        for key in ("pid", "used_memory_mib"):
            if app[key] is not None:
                try:
                    app[key] = int(float(app[key]))
                except ValueError:
                    app[key] = None
        app["gpu_index"] = by_uuid.get(app["gpu_uuid"])
        apps.append(app)
    return apps


def parse_list(text):
    """Parse ``nvidia-smi -L``: ``{gpu uuid: [{index, profile, uuid}, ...]}`` of MIG devices per GPU."""
    mig = {}
    current = None
    for line in (text or "").splitlines():
        gpu = _GPU_LINE_RE.match(line)
        if gpu:
            current = gpu.group(3).strip()
            mig.setdefault(current, [])
            continue
        device = _MIG_LINE_RE.match(line)
        if device and current is not None:
            mig[current].append({"index": int(device.group(2)), "profile": device.group(1),
                                 "uuid": device.group(3).strip()})
    return mig


def parse_mig_modes(text):
    """Parse the output of the MIG mode query: ``{gpu uuid: "Enabled" | "Disabled" | None}`` (``None``: nvidia-smi
    printed ``[N/A]``, a GPU without MIG). Raises ``NvidiaSmiError`` for output that is not the CSV asked for."""
    modes = {}
    for number, row in enumerate(_rows(text), 1):
        if len(row) != len(MIG_QUERY):
            raise NvidiaSmiError("nvidia-smi printed an unexpected line %d (expected %d comma-separated fields %s): "
                                 "%r" % (number, len(MIG_QUERY), ",".join(MIG_QUERY), ", ".join(row)))
        modes[row[0].strip()] = _value(row[1])
    return modes


def mig_without_instances(gpu):
    """Why ``gpu`` (a ``gpu_info`` GPU) cannot be planned when its MIG mode is on and it has no MIG device, else
    ``None``. With MIG mode on, CUDA enumerates only the GPU's MIG devices (compute instances), so a GPU with none is
    no CUDA device at all, and the CUDA device numbers of the GPUs after it shift (NVIDIA MIG user guide, "Device
    Enumeration": https://docs.nvidia.com/datacenter/tesla/mig-user-guide/mig-device-names.html, and "Getting Started
    with MIG", whose ``nvidia-smi mig -cgi ... -C`` creates GPU and compute instances and ``nvidia-smi -i N -mig 0``
    turns MIG mode off: https://docs.nvidia.com/datacenter/tesla/mig-user-guide/contents.html; real hosts in that
    state, CUDA failing: https://github.com/NVIDIA/gpu-operator/issues/382, and ``nvidia-smi -L`` listing the GPU
    line alone: https://github.com/NVIDIA/gpu-operator/issues/442)."""
    if gpu.get("mig_mode") != MIG_ENABLED or gpu.get("mig_devices"):
        return None
    index = gpu.get("index")
    return ("GPU %s (%s) has MIG mode enabled but no MIG instances: CUDA sees no device on it. Create GPU and "
            "compute instances (nvidia-smi mig -i %s -cgi <profiles> -C; nvidia-smi mig -i %s -lgip lists the "
            "profiles), or turn MIG mode off (nvidia-smi -i %s -mig 0, then reset the GPU or reboot)" % (
                index, gpu.get("name"), index, index, index))


def topology(gpus):
    """``cpu`` (no GPU), ``single``, ``dual`` or ``multi``."""
    count = len(gpus)
    return "cpu" if count == 0 else "single" if count == 1 else "dual" if count == 2 else "multi"


def held_by(apps, pids):
    """The GPU memory the processes ``pids`` hold: ``{gpu index: MiB}`` (only GPUs where they hold some)."""
    pids = set(pids)
    held = {}
    for app in apps:
        if app.get("pid") in pids and app.get("gpu_index") is not None:
            held[app["gpu_index"]] = held.get(app["gpu_index"], 0) + (app.get("used_memory_mib") or 0)
    return held


def gather(run, processes=False, pids=None):
    """Everything ``gpu_info`` returns, given ``run(args) -> (rc, stdout, stderr)`` that runs nvidia-smi.

    Returns a dict with ``gpus``, ``topology``, ``warnings`` and (with ``processes``) ``processes``. With
    ``pids`` (a process tree), every GPU gets ``memory_held_by_pid_mib``: what those processes hold on it.
    Raises ``NvidiaSmiError`` with nvidia-smi's own words when it fails.
    """
    fields = GPU_FIELDS
    rc, out, err = run(query_gpu_args(fields))
    warnings = []
    if rc != 0 and invalid_field(out + "\n" + (err or "")):
        field = invalid_field(out + "\n" + (err or ""))
        fields = tuple(f for f in GPU_FIELDS if f != field)
        warnings.append("this driver does not know the field %s (drivers before 510 lack compute_cap): "
                        "%s is left empty" % (field, _KEY_OF.get(field, field)))
        rc, out, err = run(query_gpu_args(fields))
    message = failure_message(rc, out, err)
    if message:
        raise NvidiaSmiError(message)
    gpus, parse_warnings = parse_gpus(out, fields)
    warnings.extend(parse_warnings)
    for gpu in gpus:
        gpu["mig_mode"] = None
        gpu["mig_devices"] = []
    if gpus:
        rc, out, err = run(list_args())
        mig = parse_list(out) if rc == 0 else {}
        rc, out, err = run(query_mig_args())
        modes = parse_mig_modes(out) if rc == 0 else {}
        for gpu in gpus:
            gpu["mig_mode"] = modes.get(gpu["uuid"])
            gpu["mig_devices"] = mig.get(gpu["uuid"], [])
            refusal = mig_without_instances(gpu)
            if refusal:
                warnings.append(refusal)
            if gpu["mig_devices"]:
                warnings.append("GPU %s (%s) is in MIG mode: CUDA sees its %d MIG devices (%s), each with a slice "
                                "of the memory, not the whole GPU" % (
                                    gpu["index"], gpu["name"], len(gpu["mig_devices"]),
                                    ", ".join(d["profile"] for d in gpu["mig_devices"])))
    result = {"gpus": gpus, "topology": topology(gpus), "warnings": warnings}
    if processes or pids is not None:
        apps = []
        if gpus:
            rc, out, err = run(query_apps_args())
            message = failure_message(rc, out, err)
            if message:
                raise NvidiaSmiError(message)
            apps = parse_apps(out, gpus)
        if processes:
            result["processes"] = apps
        if pids is not None:
            held = held_by(apps, pids)
            for gpu in gpus:
                gpu["memory_held_by_pid_mib"] = held.get(gpu["index"], 0)
    return result


def read(find_binary, run_command, pid=None, processes=False, pids=None):
    """What ``gpu_info`` returns, with ``warnings``: ``find_binary(name)`` finds nvidia-smi (``None``: a host
    without NVIDIA GPU, topology ``cpu``), ``run_command(argv) -> (rc, stdout, stderr)`` runs it. With ``pid``,
    the process tree of ``pid`` (``process_tree``, from ``/proc``) and the memory it holds on each GPU.
    ``pids``: that tree when the caller walked it already. Raises ``NvidiaSmiError`` (with ``binary``) when
    nvidia-smi fails."""
    tree = {"pid": pid, "pids": pids if pids is not None else process_tree(pid)} if pid is not None else None
    binary = find_binary("nvidia-smi")
    if binary is None:
        result = {"gpus": [], "topology": "cpu", "warnings": []}
    else:
        try:
            result = gather(lambda args: run_command([binary] + args), processes=processes,
                            pids=tree["pids"] if tree else None)
        except NvidiaSmiError as exc:
            raise NvidiaSmiError(str(exc), binary) from None
    result["nvidia_smi"] = binary
    if tree:
        result["process_tree"] = tree
    return result


# ``nvidia-smi -q`` (nvidia-smi(1), "-q, --query": every GPU attribute as "Name : value" lines): the one place
# nvidia-smi prints the driver's CUDA version ("CUDA Version", also in the default banner) and NVML's brand
# ("Product Brand", nvmlDeviceGetBrand), neither of which ``--query-gpu`` offers. A GPU's section starts with
# "GPU <PCI bus id>", the id ``pci.bus_id`` prints.
_DETAIL_GPU_RE = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")
_DETAIL_LINE_RE = re.compile(r"^(\s*)([^:]+?)\s*:\s*(.*?)\s*$")


def details_args():
    """The arguments of ``nvidia-smi -q``."""
    return ["-q"]


def parse_details(text):
    """``{"driver_version", "cuda_version", "gpus": {PCI bus id in upper case: {"product_name", "product_brand"}}}``
    from ``nvidia-smi -q``; ``None`` for a value nvidia-smi does not give ("N/A", "Not Found" on a host without CUDA
    driver)."""
    found = {"driver_version": None, "cuda_version": None, "gpus": {}}
    current = None
    for line in text.splitlines():
        gpu = _DETAIL_GPU_RE.match(line)
        if gpu:
            current = found["gpus"].setdefault(gpu.group(1).upper(), {"product_name": None, "product_brand": None})
            continue
        match = _DETAIL_LINE_RE.match(line)
        if not match:
            continue
        indent, name, raw = len(match.group(1)), match.group(2), match.group(3)
        value = None if raw in UNAVAILABLE or raw in ("", "Not Found") else raw
        if indent == 0 and name in ("Driver Version", "CUDA Version"):
            found[name.lower().replace(" ", "_")] = value
        elif current is not None and indent == 4 and name in ("Product Name", "Product Brand"):
            current[name.lower().replace(" ", "_")] = value
    return found
