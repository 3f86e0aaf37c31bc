"""Adaptive eager under a changed default dtype: an int tensor times a float scalar takes it,
when recorded and when run (Note [The default dtype of a recorded op] in adaptive/launch.py)."""
import warnings

import pytest
import torch

import neuron_eager
from test_adaptive import both_modes, rand, same_bits

pytestmark = pytest.mark.usefixtures("plain_after")


def test_promotion_follows_a_changed_default_dtype():
    i = torch.arange(6, device="neuron")
    saved = torch.get_default_dtype()
    try:
        for dtype in (torch.float32, torch.float64, torch.float32):
            torch.set_default_dtype(dtype)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # (float64 is computed in float32)
                both_modes(lambda: ((i * 0.5 + 1).sqrt(), i / 4))
            with neuron_eager.adaptive_eager():
                assert (i * 0.5 + 1).sqrt().dtype == dtype
    finally:
        torch.set_default_dtype(saved)


@pytest.mark.parametrize("recorded,run", [(torch.float64, torch.float32),
                                           (torch.float32, torch.float64),
                                           (torch.bfloat16, torch.float32)])
def test_ops_recorded_before_the_default_dtype_changes_keep_its_promotion(recorded, run):
    # Note [The default dtype of a recorded op] in adaptive/launch.py
    i = rand(6, dtype=torch.int32)

    def program():
        torch.set_default_dtype(recorded)
        y = i * 2.5 + 1  # the default dtype's
        torch.set_default_dtype(run)
        z = y[1:]  # a view of the pending result, then the region runs under `run`
        return y.detach().cpu(), z.cpu(), y.untyped_storage().nbytes()

    saved = torch.get_default_dtype()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (float64 is computed in float32)
            expected = program()
            for _ in range(3):
                with neuron_eager.adaptive_eager():
                    got = program()
                same_bits(got[0], expected[0])
                same_bits(got[1], expected[1])
                assert got[2] == expected[2]
    finally:
        torch.set_default_dtype(saved)
