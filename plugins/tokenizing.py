"""Loading a package's tokenizer the way every built-in family needs it.

A family reads request text with its package's fast tokenizer, but never with
the tokenizer file's own truncation or padding (the model's configured limit
counts, DESIGN §4), and never lets request text that spells a special token
(``[SEP]``, ``<|im_end|>``) become that token.

Two loaders:

- :func:`load_encoder_tokenizer`, what an encoder family needs (the token ids,
  type ids, offsets and special-token envelope of ``tokenizer.json``, and the pad
  id): read with the ``tokenizers`` library alone, without importing transformers,
  for the tokenizer classes whose transformers fix-ups it repeats
  (:data:`RAW_CLASSES`); any other package goes through transformers.
- :func:`load_fast_tokenizer`, transformers' ``AutoTokenizer`` (a decoder family
  needs its chat template and its special-token attributes).

What transformers (4.x, ``PreTrainedTokenizerFast`` and ``BertTokenizerFast``) does
to the ``tokenizers.Tokenizer`` of ``tokenizer.json``, repeated here step by step:

1. the special tokens come from ``tokenizer_config.json``, the class defaults
   (BERT's ``[UNK]`` ... ``[MASK]``) and, for a config without
   ``added_tokens_decoder``, ``special_tokens_map.json`` (its values win);
2. the added tokens (the config's ``added_tokens_decoder``, else the
   ``added_tokens`` of ``tokenizer.json``), then the special tokens not among them,
   are added again with ``Tokenizer.add_tokens`` (a token the file holds with the
   same attributes is left as it is);
3. BERT: a ``BertNormalizer`` whose ``lowercase``, ``strip_accents`` or
   ``handle_chinese_chars`` differs from the config's ``do_lower_case``,
   ``strip_accents``, ``tokenize_chinese_chars`` (defaults ``True``, ``None``,
   ``True``) is rebuilt with the config's values;
4. a pre-tokenizer with an ``add_prefix_space`` other than the config's (default
   ``False``) is rebuilt with it.

``tests/plugins/test_tokenizing.py`` checks that both loaders give the same
serialised tokenizer and the same ids, type ids, offsets and special-token masks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

RAW_CLASSES = {
    "BertTokenizer": {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
    "BertTokenizerFast": {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
    "PreTrainedTokenizerFast": {},
}
"""``tokenizer_class`` -> its special-token defaults: the classes :func:`load_encoder_tokenizer`
reads without transformers."""

SPECIAL_ROLES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
    "additional_special_tokens",
)
"""transformers' special-token attributes, in its order."""

LARGE_VOCABULARY = 100_000
"""Above this many ids transformers may patch a pre-tokenizer's regex (Mistral's): such a
tokenizer goes through transformers."""


@dataclass(frozen=True)
class EncoderTokenizer:
    """An encoder's tokenizer as a family reads text with it.

    Attributes:
        backend: the ``tokenizers.Tokenizer``, truncation and padding off; set
            ``encode_special_tokens`` on it to read request text as text.
        pad_id: the pad token's id (``None`` when the package names no pad token).
        special_tokens: role (``cls_token``, ...) -> token text, as transformers
            reads them (``additional_special_tokens`` left out).
        loaded_by: ``tokenizers`` (this module's reading) or ``transformers``.
    """

    backend: Any
    pad_id: int | None
    special_tokens: dict[str, str]
    loaded_by: str


def load_fast_tokenizer(package: Path) -> tuple[Any, Any]:
    """The package's transformers tokenizer and a raw ``tokenizers.Tokenizer`` copy of it.

    The copy has truncation and padding off; set ``encode_special_tokens`` on
    it (or on a further copy) to read request text as text. Remote code is
    never run and nothing is downloaded. Imports transformers (seconds): an
    encoder family uses :func:`load_encoder_tokenizer`.

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
        raise _unreadable(err) from err
    if not tokenizer.is_fast:
        raise ValueError("the package needs a fast tokenizer (tokenizer.json)")
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_truncation()
    backend.no_padding()
    return tokenizer, backend


def load_encoder_tokenizer(package: Path) -> EncoderTokenizer:
    """The package's tokenizer for an encoder, read without transformers where it can be.

    A package whose ``tokenizer_config.json`` names one of :data:`RAW_CLASSES`, with a
    ``tokenizer.json``, no ``added_tokens.json``, no ``auto_map`` or extra special
    tokens and at most :data:`LARGE_VOCABULARY` ids is read by ``tokenizers`` alone
    (the module's steps); any other through :func:`load_fast_tokenizer`. Both give the
    same tokenizer (``tests/plugins/test_tokenizing.py``).

    Raises:
        ValueError: the tokenizer files cannot be read (the message names them and
            gives the first line of the cause), or the package has no fast tokenizer.
    """
    try:
        raw = _read_raw(package)
    except Exception as err:
        raise _unreadable(err) from err
    if raw is not None:
        return raw
    tokenizer, backend = load_fast_tokenizer(package)
    specials = {
        role: str(value)
        for role, value in tokenizer.special_tokens_map.items()
        if role != "additional_special_tokens" and value is not None
    }
    pad = tokenizer.pad_token_id
    return EncoderTokenizer(backend, None if pad is None else int(pad), specials, "transformers")


def _unreadable(err: Exception) -> ValueError:
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ValueError(
        "the tokenizer files (tokenizer.json, tokenizer_config.json, vocab) cannot be "
        f"read: {first}"
    )


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _read_raw(package: Path) -> EncoderTokenizer | None:
    """The tokenizer by the module's steps, or ``None`` when transformers must read it."""
    from tokenizers import AddedToken, Tokenizer

    config = _read_json(package / "tokenizer_config.json")
    file = package / "tokenizer.json"
    if (
        not isinstance(config, dict)
        or not file.is_file()
        or (package / "added_tokens.json").exists()
    ):
        return None
    defaults = RAW_CLASSES.get(str(config.get("tokenizer_class")))
    if defaults is None or "auto_map" in config or config.get("extra_special_tokens"):
        return None
    backend = Tokenizer.from_file(str(file))
    if backend.get_vocab_size(with_added_tokens=True) > LARGE_VOCABULARY:
        return None

    def token(value: Any) -> Any:  # transformers' convert_added_tokens (save=False)
        if isinstance(value, dict) and value.get("__type") == "AddedToken":
            return AddedToken(**{k: v for k, v in value.items() if k != "__type"})
        if isinstance(value, list | tuple):
            return [token(v) for v in value]
        return value

    kwargs = {key: token(value) for key, value in config.items()}
    added: dict[int, Any] = {}
    if isinstance(config.get("added_tokens_decoder"), dict):  # step 1, 2
        for index, fields in config["added_tokens_decoder"].items():
            added[int(index)] = fields if isinstance(fields, AddedToken) else AddedToken(**fields)
    else:
        specials_map = _read_json(package / "special_tokens_map.json") or {}
        for role, value in specials_map.items():
            if isinstance(value, dict):
                kwargs[role] = AddedToken(**{**value, "special": True})
            elif role == "additional_special_tokens" and isinstance(value, list):
                extra = list(kwargs.get("additional_special_tokens") or [])
                for item in value:
                    item = (
                        AddedToken(**{**item, "special": True}) if isinstance(item, dict) else item
                    )
                    if item not in extra:
                        extra.append(item)
                kwargs[role] = extra
            else:
                kwargs[role] = value
        for fields in json.loads(file.read_text(encoding="utf-8")).get("added_tokens", []):
            fields = dict(fields)
            index = fields.pop("id")
            added[index] = AddedToken(**fields)
    by_text = {str(t): t for t in added.values()}
    given = {**defaults, **{role: kwargs[role] for role in SPECIAL_ROLES if role in kwargs}}
    if backend.padding is not None:  # the file's padding names the pad token, as there
        given.setdefault("pad_token", backend.padding["pad_token"])
    roles: dict[str, Any] = {}
    for role in SPECIAL_ROLES:
        value = given.get(role)
        if value is None:
            continue
        if role != "additional_special_tokens" and by_text:
            value = by_text.get(str(value), value)
        roles[role] = value
    extended: list[Any] = []  # transformers' all_special_tokens_extended
    seen: set[str] = set()
    for value in roles.values():
        for item in value if isinstance(value, list | tuple) else [value]:
            if item and str(item) not in seen:
                seen.add(str(item))
                extended.append(item)
    to_add = [t for _, t in sorted(added.items())]
    known = [t.content for t in backend.get_added_tokens_decoder().values()]
    encoder = known + [str(t) for t in to_add]
    to_add += [t for t in extended if t not in encoder and t not in to_add]
    special_texts = [str(t) for t in extended]
    if to_add:
        marked = []
        for item in to_add:
            if isinstance(item, str):
                marked.append(AddedToken(item, special=item in special_texts))
            else:
                item.special = item.special or str(item) in special_texts
                marked.append(item)
        backend.add_tokens(marked)
    if config.get("tokenizer_class") in ("BertTokenizer", "BertTokenizerFast"):  # step 3
        _bert_normalizer(backend, config)
    _prefix_space(backend, bool(config.get("add_prefix_space", False)))  # step 4
    backend.no_truncation()
    backend.no_padding()
    pad_text = roles.get("pad_token")
    pad_id: int | None = None
    if pad_text is not None:
        pad_id = backend.token_to_id(str(pad_text))
        if pad_id is None and roles.get("unk_token") is not None:
            pad_id = backend.token_to_id(str(roles["unk_token"]))
    specials = {
        role: str(value) for role, value in roles.items() if role != "additional_special_tokens"
    }
    return EncoderTokenizer(backend, pad_id, specials, "tokenizers")


def _bert_normalizer(backend: Any, config: dict[str, Any]) -> None:
    """Step 3: BertTokenizerFast's rebuild of a normaliser that disagrees with the config."""
    from tokenizers import normalizers

    if backend.normalizer is None:
        return
    state = json.loads(backend.normalizer.__getstate__())
    lower = config.get("do_lower_case", True)
    strip = config.get("strip_accents")
    chinese = config.get("tokenize_chinese_chars", True)
    if (
        state.get("lowercase", lower) != lower
        or state.get("strip_accents", strip) != strip
        or state.get("handle_chinese_chars", chinese) != chinese
    ):
        kind = getattr(normalizers, state.pop("type"))
        state.update(lowercase=lower, strip_accents=strip, handle_chinese_chars=chinese)
        backend.normalizer = kind(**state)


def _prefix_space(backend: Any, add_prefix_space: bool) -> None:
    """Step 4: PreTrainedTokenizerFast's rebuild of a pre-tokenizer whose
    ``add_prefix_space`` is not the config's."""
    from tokenizers import pre_tokenizers

    try:
        state = json.loads(backend.pre_tokenizer.__getstate__())
        if state.get("add_prefix_space", add_prefix_space) != add_prefix_space:
            kind = getattr(pre_tokenizers, state.pop("type"))
            state["add_prefix_space"] = add_prefix_space
            backend.pre_tokenizer = kind(**state)
    except Exception:  # no pre-tokenizer, or one that cannot be serialised: as transformers
        pass


__all__ = [
    "LARGE_VOCABULARY",
    "RAW_CLASSES",
    "EncoderTokenizer",
    "load_encoder_tokenizer",
    "load_fast_tokenizer",
]
