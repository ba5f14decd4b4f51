import pytest

from vllm_srun.plugins import Kernel, select_kernel
from vllm_srun.plugins.kernel import kernel_violations

EAGER = Kernel("attention", "eager", "eager", bit_exact=True, reference=True)
SDPA = Kernel("attention", "sdpa", "sdpa", bit_exact=False)
CUDA_EXACT = Kernel("attention", "cuda_exact", "x", bit_exact=True, accelerators=("cuda",))


def test_exact_profile_never_selects_a_kernel_that_is_not_bit_exact():
    assert select_kernel([SDPA, EAGER], "attention", "cpu") is EAGER


def test_exact_profile_prefers_a_bit_exact_kernel_made_for_the_accelerator():
    assert select_kernel([EAGER, CUDA_EXACT], "attention", "cuda") is CUDA_EXACT
    assert select_kernel([EAGER, CUDA_EXACT], "attention", "cpu") is EAGER


def test_no_admissible_kernel_and_unknown_profile_raise():
    with pytest.raises(LookupError, match="no bit-exact 'attention' kernel for accelerator 'cpu'"):
        select_kernel([SDPA], "attention", "cpu")
    with pytest.raises(ValueError, match="unknown kernel profile 'fast'"):
        select_kernel([EAGER], "attention", "cpu", profile="fast")


def test_kernel_contract():
    assert EAGER.key == "attention.eager"
    assert kernel_violations(EAGER) == []
    assert kernel_violations(Kernel("Attention", "eager", "e", True, True)) == [
        "kernel slot 'Attention' must match ^[a-z][a-z0-9_]*$"
    ]
    assert kernel_violations(Kernel("attention", "x", "e", False, True)) == [
        "a reference kernel must be bit_exact and run on every accelerator"
    ]
    assert kernel_violations(Kernel("attention", "x", 3, True)) == [  # type: ignore[arg-type]
        "kernel implementation must be a callable or a string"
    ]
