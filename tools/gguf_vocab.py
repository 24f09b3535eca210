"""Generated vocabularies and their tokenizer metadata for the GGUF files of ``gguf_models``: a SentencePiece-style
vocabulary (``llama``) and a byte-level BPE one (``gpt2``), deterministic and of any size.
"""
from __future__ import annotations

import gguf


def _spm_vocab(n_vocab: int):
    """A SentencePiece-style ('llama') vocab: <unk> <s> </s>, byte tokens <0x00>..<0x7F> only, pieces.

    Only ASCII bytes: with all 256 byte tokens a random model can emit a lone high byte and
    llama-server's ``/completion`` answers HTTP 500.
    """
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    for b in range(0x80):
        tokens.append("<0x%02X>" % b)
        types.append(gguf.TokenType.BYTE)
    pieces = ["\u2581"] + [chr(c) for c in range(33, 127)]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pieces += ["\u2581" + c for c in letters + letters.upper()]
    pieces += ["\u2581" + a + b for a in letters for b in letters]
    pieces += [a + b for a in letters for b in letters]
    seen = set(tokens)
    for p in pieces:
        if len(tokens) >= n_vocab:
            break
        if p not in seen:
            seen.add(p)
            tokens.append(p)
            types.append(gguf.TokenType.NORMAL)
    if len(tokens) < n_vocab:
        raise ValueError("n_vocab %d is larger than the generated SPM vocab (%d)" % (n_vocab, len(tokens)))
    scores = [0.0] * 3 + [0.0] * 0x80 + [-float(i) for i in range(len(tokens) - 3 - 0x80)]
    return tokens, scores, [int(t) for t in types]


def add_spm_tokenizer(w: gguf.GGUFWriter, n_vocab: int) -> None:
    tokens, scores, types = _spm_vocab(n_vocab)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _bpe_vocab(n_vocab: int, n_merges: int, n_special: int = 1000):
    """A GPT-2 style (byte-level BPE) vocab of exactly ``n_vocab`` tokens and ``n_merges`` merges."""
    tokens = ["<unk>", "<s>", "</s>"] + ["<SPECIAL_%d>" % i for i in range(3, n_special)]
    tokens = tokens[:min(n_special, n_vocab)]
    types = [int(gguf.TokenType.CONTROL)] * len(tokens)
    # GPT-2 bytes_to_unicode: printable stand-ins for the 256 bytes
    byte_chars = [chr(b) for b in range(33, 127)] + [chr(b) for b in range(161, 173)] + [chr(b) for b in range(174, 256)]
    byte_chars += [chr(256 + i) for i in range(256 - len(byte_chars))]
    alphabet = "etaoinshrdlucmfwypvbgkjqxz"
    for c in byte_chars:
        if len(tokens) >= n_vocab:
            break
        tokens.append(c)
        types.append(int(gguf.TokenType.NORMAL))
    seen = set(tokens)
    i = 0
    while len(tokens) < n_vocab:
        s, k = "", i
        while True:  # bijective base-26 word
            s = alphabet[k % 26] + s
            k = k // 26 - 1
            if k < 0:
                break
        word = ("\u0120" if i % 3 == 0 else "") + s
        i += 1
        if word not in seen:  # llama.cpp asserts that token strings are unique
            seen.add(word)
            tokens.append(word)
            types.append(int(gguf.TokenType.NORMAL))
    merges = []
    n_words = max(1, n_vocab - n_special - 256)
    j = 0
    while len(merges) < n_merges:
        left = tokens[n_special + 256 + (j % n_words)] if n_vocab > n_special + 256 else "a"
        right = alphabet[(j // n_words) % 26] + ("" if j < n_words * 26 else str(j // (n_words * 26)))
        merges.append(left + " " + right)
        j += 1
    return tokens, types, merges


def add_bpe_tokenizer(w: gguf.GGUFWriter, n_vocab: int, n_merges: int, pre: str = "default") -> None:
    tokens, types, merges = _bpe_vocab(n_vocab, n_merges)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
