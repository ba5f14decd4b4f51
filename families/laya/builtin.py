"""The published Laya checkpoints this family knows, pinned at reviewed revisions.

The three checkpoints the ``laya`` package publishes, each at the commit its
``laya/revisions.py`` lists as reviewed (``PINNED_REVISIONS``, laya 0.4.15):

- ``convaiinnovations/laya``: English, ModernBERT-large, 512 tokens (the repository also
  bundles the other two in subfolders; only the root checkpoint's files are fetched);
- ``convaiinnovations/laya-multilingual``: mmBERT-base, 100+ languages, 1024 tokens;
- ``convaiinnovations/laya-typed-decisions``: ModernBERT-large fine-tuned on the package's
  typed-decisions workflows, 1024 tokens.

No digests of their files are recorded here (none could be computed on these machines,
which reach no model hub), so each is pinned by its revision alone: the files named by
:data:`CHECKPOINT_PATTERNS` are fetched at that commit, and the first load computes their
digests and reports them as the model's identity (the card's ``verification`` says
``computed``). Parameter counts are read from the weights' headers on load.
"""

from __future__ import annotations

from vllm_srun.plugins import ModelEntry, hookimpl
from vllm_srun.plugins.hookspecs import RegisterModel

CHECKPOINT_PATTERNS = ("rl_agent_config.json", "model.safetensors", "tokenizer/*", "encoder/*")
"""A checkpoint's files at the repository's root (as the package itself fetches them)."""

LICENCE = "apache-2.0"
"""The licence the ``laya`` package states for itself and its checkpoints (its README); the
repositories' own model cards could not be read here."""


def _entry(name: str, revision: str, description: str) -> ModelEntry:
    return ModelEntry(
        name=name,
        family="laya",
        revision=revision,
        files={},
        licence=LICENCE,
        description=description,
        patterns=CHECKPOINT_PATTERNS,
    )


LAYA = _entry(
    "convaiinnovations/laya",
    "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
    "System One decisions: Laya, English (ModernBERT-large and a decision head, 512 tokens)",
)
LAYA_MULTILINGUAL = _entry(
    "convaiinnovations/laya-multilingual",
    "e4e9ddf21a7b1903b7acffd8814ad4307bf63a67",
    "System One decisions: Laya, 100+ languages (mmBERT-base and a decision head, 1024 tokens)",
)
LAYA_TYPED_DECISIONS = _entry(
    "convaiinnovations/laya-typed-decisions",
    "1a793eb568e6718f15941d08f85432581df534e3",
    "System One decisions: Laya fine-tuned on typed-decisions workflows (ModernBERT-large, "
    "1024 tokens)",
)

BUILTIN_MODELS = (LAYA, LAYA_MULTILINGUAL, LAYA_TYPED_DECISIONS)


@hookimpl
def register_models(register: RegisterModel) -> None:
    """Register the published Laya checkpoints at their reviewed revisions."""
    for entry in BUILTIN_MODELS:
        register(entry)
