"""Loading a package's tokenizer the way every built-in family needs it.

A family reads request text with its package's fast tokenizer, but never with
the tokenizer file's own truncation or padding (the model's configured limit
counts, DESIGN §4), and never lets request text that spells a special token
(``[SEP]``, ``<|im_end|>``) become that token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_fast_tokenizer(package: Path) -> tuple[Any, Any]:
    """The package's transformers tokenizer and a raw ``tokenizers.Tokenizer`` copy of it.

    The copy has truncation and padding off; set ``encode_special_tokens`` on
    it (or on a further copy) to read request text as text. Remote code is
    never run and nothing is downloaded.

    Returns:
        ``(tokenizer, backend)``: the ``PreTrainedTokenizerFast`` (special-token
        ids, chat template) and the ``tokenizers.Tokenizer``.

    Raises:
        ValueError: the tokenizer files cannot be read (the message names them
            and gives the first line of the cause), or the package has no fast
            tokenizer (``tokenizer.json``).
    """
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(  # type: ignore[no-untyped-call]
            str(package), trust_remote_code=False, local_files_only=True
        )
    except Exception as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(
            "the tokenizer files (tokenizer.json, tokenizer_config.json, vocab) cannot be "
            f"read: {first}"
        ) from err
    if not tokenizer.is_fast:
        raise ValueError("the package needs a fast tokenizer (tokenizer.json)")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return tokenizer, backend
