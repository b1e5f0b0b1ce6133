"""A reader's own files, made small and real, and a fingerprint to prove nothing touched them.

The docs write ``/path/to/...`` for the reader's checkpoint and data; the tests put these in
their place: a small chat checkpoint (a Qwen2 with a byte-level BPE tokenizer and a ChatML
template, saved with ``save_pretrained``) and data files with the field names the docs use.
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib


def rows() -> list[dict]:
    """Rows with every field name the docs use for a reader's data set."""
    return [
        {
            "prompt": f"{a}+{b}=",
            "answer": str(a + b),
            "question": f"{a}+{b}=",
            "solution": str(a + b),
        }
        for a in range(20)
        for b in range(20)
    ]


def chat_checkpoint(path: pathlib.Path) -> pathlib.Path:
    """A small Hugging Face chat checkpoint at ``path`` (made once)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from rltrain.tasks.gsm8k_tiny import build_bpe_tokenizer

    if path.exists():
        return path
    tok = build_bpe_tokenizer([f"{r['question']} {r['solution']}" for r in rows()], vocab_size=320)
    config = Qwen2Config(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    Qwen2ForCausalLM(config).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def data_file(path: pathlib.Path) -> pathlib.Path:
    """A data file at ``path`` (Parquet for ``.parquet``, else JSON lines), made once."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows()), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows()))
    return path


def fingerprint(root: pathlib.Path) -> dict[str, tuple]:
    """Every file and directory under ``root`` (``root`` included): kind, size, modification
    time and, for files, a SHA-256 of the contents. Equal fingerprints: nothing was written,
    replaced or deleted there."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        d = pathlib.Path(dirpath)
        st = d.stat()
        out[str(d.relative_to(root))] = ("dir", st.st_mtime_ns, tuple(sorted(dirnames + filenames)))
        for name in filenames:
            f = d / name
            st = f.lstat()
            digest = hashlib.sha256(f.read_bytes()).hexdigest() if f.is_file() else ""
            out[str(f.relative_to(root))] = ("file", st.st_size, st.st_mtime_ns, digest)
    return out
