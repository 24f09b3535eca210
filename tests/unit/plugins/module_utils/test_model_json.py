"""The model summary gguf_info returns, checked against gguf-py's own reader (llama.cpp's gguf-py, GGUFReader) on
real GGUF files: the metadata the memory model reads and nothing else, one row per tensor, JSON types only, and
read back unchanged; a summary that is not one is refused with the field named."""
from __future__ import annotations

import json

import gguf
import pytest

from ansible_collections.ai_llm.moe_offload.plugins.module_utils import _model_json as ms
from ansible_collections.ai_llm.moe_offload.plugins.module_utils.gguf.model import read_model
from tools.gguf_models import write_tiny_nemotron_h_moe, write_tiny_qwen3moe

WRITERS = {"qwen3moe": write_tiny_qwen3moe, "nemotron_h_moe": write_tiny_nemotron_h_moe}


def truth(path):
    """gguf-py's view of the file: ``{key: value}`` and ``[[name, type, shape, bytes]]``."""
    reader = gguf.GGUFReader(path)
    fields = dict((key, field.contents()) for key, field in reader.fields.items() if not key.startswith("GGUF."))
    rows = [[t.name, int(t.tensor_type), [int(d) for d in t.shape], int(t.n_bytes)] for t in reader.tensors]
    return fields, rows


@pytest.fixture(scope="module", params=sorted(WRITERS))
def model(request, tmp_path_factory):
    path = WRITERS[request.param](str(tmp_path_factory.mktemp("summary") / "model.gguf"))
    return request.param, path, read_model(path)


def test_the_summary_is_the_arch_metadata_and_every_tensor_and_reads_back_unchanged(model):
    arch, path, read = model
    fields, rows = truth(path)
    summary = ms.summarize(read)
    assert summary["version"] == ms.SUMMARY_VERSION == 1
    assert summary["architecture"] == arch and summary["files"] == [path] and summary["warnings"] == []
    wanted = dict((k, v) for k, v in fields.items() if k == "general.architecture" or k.startswith(arch + "."))
    tokens = len(fields["tokenizer.ggml.tokens"])
    assert summary["metadata"] == dict(wanted, **{"tokenizer.ggml.tokens": {"count": tokens}})
    assert any(isinstance(v, list) for v in wanted.values()) == (arch == "nemotron_h_moe")  # per-layer arrays
    assert summary["tensors"] == rows
    assert json.loads(json.dumps(summary)) == summary
    back_arch, metadata, tensors, files, warnings = ms.read_summary(json.loads(json.dumps(summary)))
    assert (back_arch, files, warnings) == (arch, [path], [])
    counted = metadata.pop("tokenizer.ggml.tokens")
    assert isinstance(counted, ms.CountedArray) and len(counted) == tokens
    assert metadata == wanted
    assert [[t.name, t.type_id, list(t.shape), t.nbytes] for t in tensors] == rows
    assert all(isinstance(t.shape, tuple) for t in tensors)


def test_long_arrays_are_kept_as_their_length():
    class Skipped:  # what the reader gives for an array longer than it keeps: its count only
        count = 151936

    assert ms._plain(Skipped()) == {"count": 151936}
    assert ms._plain([1, 2, 3]) == [1, 2, 3] and ms._plain((4, 5)) == [4, 5] and ms._plain("abc") == "abc"
    assert ms._plain(b"caf\xc3\xa9 \xff") == "caf\u00e9 \ufffd"
    assert ms._restore([{"count": 3}, {"count": "3"}, {"count": 3, "x": 1}]) == [
        ms.CountedArray(3), {"count": "3"}, {"count": 3, "x": 1}]


GOOD = {"version": 1, "architecture": "qwen3moe", "metadata": {"general.architecture": "qwen3moe"},
        "tensors": [["token_embd.weight", 0, [64, 512], 131072], ["x", None, [], None], ["empty", 1, [0, 8], 0]],
        "files": ["/m.gguf"], "warnings": ["one", 2]}


@pytest.mark.parametrize("change, message", [
    ("not a dict", "model must be the model summary of gguf_info (a dict), got str"),
    ({"version": 2}, "model.version is 2: this collection reads model summaries of version 1 (run gguf_info of this "
                     "collection again)"),
    ({"version": None}, "model.version is None: this collection reads model summaries of version 1"),
    ({"architecture": None}, "model.architecture must be a string"),
    ({"metadata": []}, "model.metadata must be a dict"),
    ({"tensors": []}, "model.tensors must be a non-empty list of [name, type_id, shape, bytes]"),
    ({"tensors": "x"}, "model.tensors must be a non-empty list of [name, type_id, shape, bytes]"),
    ({"files": "/m.gguf"}, "model.files must be a list of paths"),
    ({"files": ["/m.gguf", 1]}, "model.files must be a list of paths"),
    ({"tensors": [["a", 0, [1], 4], ["b", 0, [1], 4, 5]]},
     "model.tensors[1] must be [name, type_id, shape, bytes], got ['b', 0, [1], 4, 5]"),
] + [({"tensors": [row]}, "model.tensors[0] must be") for row in (
    [1, 0, [1], 4], ["a", "f32", [1], 4], ["a", 0, "1", 4], ["a", 0, [1, -1], 4], ["a", 0, [1, True], 4],
    ["a", 0, [1.0], 4], ["a", 0, [1], -4], ["a", 0, [1], "4"])])
def test_a_bad_summary_names_the_field(change, message):
    summary = change if isinstance(change, str) else dict(GOOD, **change)
    with pytest.raises(ms.SummaryError) as raised:
        ms.read_summary(summary)
    assert str(raised.value).startswith(message)


def test_a_good_summary_and_where_it_came_from():
    arch, metadata, tensors, files, warnings = ms.read_summary(GOOD)
    assert (arch, metadata, files, warnings) == ("qwen3moe", {"general.architecture": "qwen3moe"}, ["/m.gguf"], ["one"])
    # a dimension of 0 and 0 bytes are a tensor (gguf.cpp accepts ne[j] >= 0: an empty tensor)
    assert tensors == [ms.SummaryTensor("token_embd.weight", 0, (64, 512), 131072),
                       ms.SummaryTensor("x", None, (), None), ms.SummaryTensor("empty", 1, (0, 8), 0)]
    assert ms.read_summary(dict(GOOD, files=None, warnings=None))[3:] == ([], [])
    with pytest.raises(ms.SummaryError, match=r"^plan\.model\.metadata must be a dict$"):
        ms.read_summary(dict(GOOD, metadata=None), where="plan.model")


def test_a_file_without_an_architecture_has_an_empty_one(tmp_path):
    """A file whose ``general.architecture`` key is missing (here renamed in place, same length): the summary
    says ``""`` and keeps none of the model's ``<arch>.*`` keys, only the token count."""
    path = write_tiny_qwen3moe(str(tmp_path / "model.gguf"))
    data = open(path, "rb").read()
    assert data.count(b"general.architecture") == 1
    with open(path, "wb") as handle:
        handle.write(data.replace(b"general.architecture", b"general.architecturX"))
    summary = ms.summarize(read_model(path))
    assert summary["architecture"] == ""
    assert summary["metadata"] == {"tokenizer.ggml.tokens": {"count": 512}}
