# -*- coding: utf-8 -*-
# Copyright: contributors to ai_llm.moe_offload
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The plan in words: ``reason`` says why a plan does not fit on its GPUs or its host and what to lower, or what
goes where (host memory, another GPU) and why; ``split_text`` and ``blocks_text`` write a split and a list of
blocks as the plan reports them. Standard library only: this runs on target hosts (Python >= 3.9).
"""

from __future__ import annotations

from ansible_collections.ai_llm.moe_offload.plugins.module_utils._common import MIB
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._compute_buffers import OP_OFFLOAD_MIN_BATCH
from ansible_collections.ai_llm.moe_offload.plugins.module_utils._plan_options import MAX_PARALLEL


def blocks_text(blocks):
    return ", ".join(str(b) for b in blocks) if blocks else "none"


def split_text(shares):
    total = float(sum(shares))
    return ",".join(("%.3f" % (s / total)).rstrip("0").rstrip(".") or "0" for s in shares)


def _contents(facts, answer, parallel):
    """What the plan counts, in words, without naming what the model does not have."""
    parts = ["the weights"]
    kv = answer["kv_cache"]
    if kv["full_blocks"] or kv["swa_blocks"]:
        text = "the KV cache for %d tokens" % answer["n_ctx"]
        if kv["swa_blocks"]:
            text += " (%d of its %d blocks keep a %s window: %d cells per slot)" % (
                len(kv["swa_blocks"]), len(kv["swa_blocks"]) + len(kv["full_blocks"]),
                "chunked" if kv["window_kind"] == "chunked" else "sliding", kv["swa_cells"])
        parts.append(text)
    if facts.recurrent_blocks:
        parts.append("the recurrent state of %d slot(s)" % parallel)
    parts.append("the compute buffer")
    return ", ".join(parts[:-1]) + " and " + parts[-1]


def _where(candidate):
    """The GPUs of a placement with their free memory, and the split of a split placement."""
    names = " + ".join("%s (%d MiB free)" % (d.name, d.memory_free_mib) for d in candidate.gpus)
    return names if candidate.label == "single" else "%s, split %s" % (names, split_text(candidate.shares))


def _headroom_text(answer, parallel):
    here = answer["headroom"]["this_plan"]
    if not here["max_ctx_size"]:
        return ""
    if here["max_ctx_size"] >= here["ctx_size_capped_at"]:
        context = "The whole context searched (%d tokens, the training context) fits with %d slot(s)" % (
            here["ctx_size_capped_at"], parallel)
    else:
        context = "At most %d tokens of context fit with %d slot(s)" % (here["max_ctx_size"], parallel)
    if here["max_parallel"] >= MAX_PARALLEL:
        slots = "%d slots or more at this context" % MAX_PARALLEL
    else:
        slots = "at most %d slot(s) at this context" % here["max_parallel"]
    return " %s, and %s." % (context, slots)


def _host_text(answer, mmap):
    host = answer["memory"]["host"]
    how = "in the page cache of the model file (mmap)" if mmap else (
        "pinned (--no-mmap)" if host["pinned"] else "in host memory (--no-mmap)")
    return "%.0f MiB of weights are read from host memory, %s" % (host["model_mib"], how)


def reason(facts, answer, candidate, baseline, host, options, tried=()):
    """The decision in plain words: why it does not fit and what to lower, or what goes where and why, and its
    predicted speed (with goal ``speed``, against the other placements ``tried`` that fit)."""
    if any(e["free_after_mib"] < 0 for e in answer["memory"]["gpus"]):
        return _gpu_short_text(facts, answer, candidate, options)
    if host is not None and answer["memory"]["host"]["free_after_mib"] < 0:
        return _host_short_text(answer, candidate, host, options.mode)
    return _placement_text(facts, answer, candidate, baseline, host, options) + _speed_text(
        answer, candidate, options, tried)


def _placement_text(facts, answer, candidate, baseline, host, options):
    """What goes where and why, for a plan that fits."""
    if candidate.label == "cpu":
        return _cpu_text(facts, answer, host, options.parallel)
    host_note = "" if host is not None else " Host memory was not checked (give host, the result of host_info)."
    if candidate.n_gpu_layers is not None and not answer["cpu_expert_layers"] and not answer["pattern"]:
        return _layers_text(facts, answer, candidate, options) + host_note
    if not answer["cpu_expert_layers"] and not answer["device_overrides"] and not answer["pattern"]:
        gpus = answer["memory"]["gpus"]
        text = "Everything fits on %s: %s need %.0f MiB including the %d MiB margin" % (
            _where(candidate), _contents(facts, answer, options.parallel), sum(e["total_mib"] for e in gpus),
            gpus[0]["margin_mib"])
        if not facts.dense:
            text += ", so no expert moves to host memory and the GPU keeps full speed"
        return text + "." + _headroom_text(answer, options.parallel) + host_note
    text = _offload_text(facts, answer, candidate, baseline, options)
    if candidate.n_gpu_layers is not None:
        text += (" With -ngl %d the weights, KV cache and recurrent state of %s also stay in host memory and the "
                 "CPU computes them." % (candidate.n_gpu_layers, _host_blocks(facts, candidate.n_gpu_layers)))
    return text + host_note


def _host_blocks(facts, n_gpu_layers):
    """The blocks ``-ngl n_gpu_layers`` leaves on the host, as the plan reports them."""
    count = max(0, facts.block_count + 1 - n_gpu_layers)
    return "block 0" if count == 1 else "blocks 0-%d" % (count - 1)


def _layers_text(facts, answer, candidate, options):
    """A plan with fewer layers on the GPUs (``-ngl`` below all) and every expert beside its layer."""
    gpus = answer["memory"]["gpus"]
    host = answer["memory"]["host"]
    return ("With -ngl %d the weights, KV cache and recurrent state of %s stay in host memory and the CPU "
            "computes them; the other blocks and the output layer fit on %s: %s need %.0f MiB there including the "
            "%d MiB margin, and the host holds %.0f MiB of weights and %.0f MiB of caches." % (
                candidate.n_gpu_layers, _host_blocks(facts, candidate.n_gpu_layers), _where(candidate),
                _contents(facts, answer, options.parallel), sum(e["total_mib"] for e in gpus), gpus[0]["margin_mib"],
                host["model_mib"], host["kv_mib"] + host["recurrent_mib"])
            + _headroom_text(answer, options.parallel))


def _figures(speed):
    return "%.1f tokens/s decode, %.0f tokens/s prompt" % (speed["decode_tokens_per_second"] or 0,
                                                           speed["prompt_tokens_per_second"] or 0)


def _candidate_text(candidate):
    """A placement the planner weighed, in a few words."""
    gpus = ", ".join(str(g.index) for g in candidate.gpus)
    where = {"single": "GPU %s alone" % gpus, "cpu": "the CPU"}.get(
        candidate.label, "split over GPUs %s" % gpus)
    moved = " and those of %d on another GPU" % len(candidate.moved) if candidate.moved else ""
    blocks = len(candidate.cpu_blocks)
    held = ("the experts of %d block(s) in host memory" % blocks) if blocks else "no expert in host memory"
    if candidate.sizer.fixed_cpu is not None:
        held = "the given pattern's tensors in host memory"
    if candidate.n_gpu_layers is not None:
        layers = candidate.n_gpu_layers
        held = "-ngl %d (%s on the CPU)" % (layers, _host_blocks(candidate.sizer.facts, layers))
    return "%s with %s%s" % (where, held, moved)


def _speed_text(answer, candidate, options, tried):
    """The predicted speed of the plan, and with goal speed how it compares with the other placements that fit."""
    speed = answer["speed"]
    text = " Predicted speed: %s (%s; at a full slot of %d tokens; speed.from has the terms)." % (
        _figures(speed), "calibrated" if speed["calibrated"] else "not calibrated", speed["terms"]["context_tokens"])
    if options.goal != "speed":
        return text
    others = [c for c in tried if c is not candidate and c.sizer.fits(c.result)]
    if not others:
        return text + " Goal speed: no other placement fits."
    return text + " Goal speed: %s predicts %.1f tokens/s decode, ahead of %s." % (
        _candidate_text(candidate), speed["decode_tokens_per_second"] or 0, "; ".join(
            "%s (%.1f)" % (_candidate_text(c), c.speed["decode_tokens_per_second"] or 0) for c in others))


def _gpu_short_text(facts, answer, candidate, options):
    """Why the plan does not fit on its GPUs, and what to lower."""
    gpus = answer["memory"]["gpus"]
    need = sum(e["total_mib"] for e in gpus)
    blocks = answer["cpu_expert_layers"]
    worst = min((e for e in gpus if e["free_after_mib"] < 0), key=lambda e: e["free_after_mib"])
    lower = []
    everything = answer["headroom"]["all_experts_on_cpu"]["max_ctx_size"]
    lower.append("ctx_size (at most %d fits%s)" % (everything, "" if facts.dense else " with all experts on CPU")
                 if everything else "ctx_size")
    if facts.recurrent_blocks or facts.sliding_window or len(blocks) < len(facts.expert_blocks):
        lower.append("parallel")
    lower += ["cache_type_k/cache_type_v (q8_0 halves the KV cache)", "margin_mib", "ubatch"]
    sizes = facts.expert_bytes_by_block()
    copy = max([sizes.get(b, 0) for b in blocks] + [0])
    if copy and options.op_offload and options.ubatch >= OP_OFFLOAD_MIN_BATCH:
        lower.append("op_offload (false, with llama-server --no-op-offload, frees the %.0f MiB the GPU reserves "
                     "to compute on host-resident experts, at the cost of slower prompt processing)"
                     % (copy / float(MIB)))
    if options.mode not in ("auto", "all") and len(blocks) < len(facts.expert_blocks):
        lower.insert(0, "mode (auto or all moves more experts)")
    what = "%s need %.0f MiB" % (_contents(facts, answer, options.parallel), need)
    if not facts.dense:
        what = "with %s the plan needs %.0f MiB" % (
            "the experts of %d block(s) on CPU" % len(blocks) if blocks else "everything on the GPU", need)
    return ("Does not fit on %s: %s and %s MiB are missing on %s. Lower %s, or use a larger GPU." % (
        _where(candidate), what, _missing(-worst["free_after_mib"]), worst["name"], ", ".join(lower)))


def _missing(value):
    """MiB that are missing: whole MiB, or two decimals below 1 MiB (never "0 MiB are missing")."""
    return "%.0f" % value if value >= 1 else "%.2f" % value


def _host_short_text(answer, candidate, host, mode):
    """Why the host cannot hold its part of the plan."""
    host_report = answer["memory"]["host"]
    kept = ["%.0f MiB of weights" % host_report["model_mib"]]
    state = host_report["kv_mib"] + host_report["recurrent_mib"]
    if state:
        kept.append("%.0f MiB of KV cache and recurrent state" % state)
    kept.append("%.0f MiB of compute and output buffers" % (host_report["compute_mib"] + host_report["output_mib"]))
    kept.append("the %.0f MiB host margin" % host_report["margin_mib"])
    if candidate.label == "cpu":
        advice = "Free host memory, or lower ctx_size or parallel."
    else:
        advice = "Free host memory, or keep more of the model on the GPUs (%sa larger GPU, a smaller ctx_size)." % (
            "mode auto, " if mode != "auto" else "")
    numbers = (", ".join(kept[:-1]), kept[-1], host_report["total_mib"], host.available_mib, host.limited_by,
               _missing(-host_report["free_after_mib"]), advice)
    return "The host cannot hold its part: %s and %s need %.0f MiB, but %.0f MiB are available (%s), so %s " \
        "MiB are missing. %s" % numbers


def _cpu_text(facts, answer, host, parallel):
    """A plan without GPU: what the host holds."""
    host_report = answer["memory"]["host"]
    text = "No GPU: llama-server computes on the CPU and keeps everything in host memory: %s need %.0f MiB " \
        "with the %.0f MiB margin" % (_contents(facts, answer, parallel), host_report["total_mib"],
                                      host_report["margin_mib"])
    text += (" (%.0f MiB available)." % host.available_mib) if host else " (host memory not checked)."
    return text + _headroom_text(answer, parallel)


def _offload_text(facts, answer, candidate, baseline, options):
    """What moves where (to host memory, to another GPU) and why."""
    blocks = answer["cpu_expert_layers"]
    need = sum(e["total_mib"] for e in answer["memory"]["gpus"])
    where = _where(candidate)
    total_blocks = len(facts.expert_blocks)
    if answer["pattern"] and not blocks and answer["offload"]:
        head = "The given pattern moves %d tensor(s) to host memory (%s)" % (
            answer["pattern_check"]["matched"] + len(answer["pattern_check"]["non_expert"]),
            answer["pattern_check"]["verdict"])
    elif len(blocks) == total_blocks:
        head = "All routed experts (%d MoE blocks) go to host memory" % total_blocks
    elif blocks:
        head = "The routed experts of %d of the %d MoE blocks (%s) go to host memory" % (
            len(blocks), total_blocks, blocks_text(blocks))
    else:
        head = "No routed expert goes to host memory"
    if answer["device_overrides"]:
        head += "; " + "; ".join("the experts of blocks %s go to %s (GPU %d) with -ot %s=%s" % (
            blocks_text(o["blocks"]), o["device"], o["gpu_index"], o["pattern"], o["device"])
            for o in answer["device_overrides"])
    base_need = sum(e["total"] for e in baseline["gpus"]) / float(MIB)
    if candidate.sizer.fixed_cpu is not None:
        why = "as the given pattern asks, on %s" % where
    elif options.mode == "auto":
        why = "everything on the GPU would need %.0f MiB, more than %s offers" % (base_need, where)
    else:
        why = "as mode %s asks, on %s" % (options.mode, where)
    kinds = ", recurrent" if facts.recurrent_blocks else ""
    text = "%s: %s. With this plan the GPU side needs %.0f MiB (%.0f MiB saved); every attention%s, router and " \
        "shared-expert tensor stays on the GPU" % (head, why, need, answer["vram_saved_mib"], kinds)
    if blocks or answer["pattern"]:
        text += ", and " + _host_text(answer, options.mmap)
    return text + "." + _headroom_text(answer, options.parallel)
