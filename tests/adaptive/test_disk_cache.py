"""The fused kernels' disk cache: a second process compiles nothing, files are whole and
named by their content, and a cache folder that cannot be used falls back to memory."""
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch

from neuron_eager import adaptive
from neuron_eager.adaptive import codegen, fusion
from neuron_eager.ops import diskcache
from neuron_eager.ops import elementwise as E

from test_adaptive import both_modes, rand

PROGRAM = textwrap.dedent("""
    import json
    import torch, neuron_eager
    from neuron_eager import adaptive

    x = torch.linspace(-3, 3, 999).to("neuron")
    h = torch.linspace(0, 1, 999).to(torch.bfloat16).to("neuron")
    i = torch.arange(-50, 49, dtype=torch.int32).to("neuron")

    def program():
        a = torch.nn.functional.gelu(x * 1.7 + 1).sigmoid() - torch.tanh(x) / 3
        b = ((h * 2 + 1).relu() - h).view(torch.int16)
        c = ((i * 3 - 2).abs() & 7).float() * 0.5
        return [t.cpu() for t in (a, b, c)]

    adaptive.enable()
    for _ in range(3):  # op by op, then fused (compiled or loaded), then from memory
        out = program()
    print(json.dumps(dict(adaptive.stats(), bits=[t.view(torch.int16).tolist() for t in out])))
""")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test: its own cache folder, and no kernel or plan in memory from other tests."""
    monkeypatch.setenv(diskcache.ENV, str(tmp_path / "kernels"))
    monkeypatch.setattr(codegen, "_kernels", {})
    monkeypatch.setattr(fusion, "_plans", {})
    monkeypatch.setattr(diskcache, "_warned", set())
    adaptive.reset_stats()
    yield
    adaptive.disable()


def _run_program(tmp_path) -> dict:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=dict(os.environ), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_second_process_compiles_nothing(tmp_path):
    first = _run_program(tmp_path)
    assert first["compiles"] >= 2 and first["disk_writes"] == first["compiles"]
    assert first["disk_hits"] == 0 and first["disk_fallbacks"] == 0
    second = _run_program(tmp_path)
    assert second["compiles"] == 0 and second["disk_writes"] == 0
    assert second["disk_hits"] == first["compiles"]
    assert second["fused_kernels"] == first["fused_kernels"]
    assert second["bits"] == first["bits"]


def test_kernel_files_are_whole_and_named_by_their_content(tmp_path):
    x = rand(40, 3)
    both_modes(lambda: (x * 2 + 1).relu() - x)
    files = sorted(diskcache.folder().glob("k_*.py"))
    assert len(files) == 1 and adaptive.stats()["disk_writes"] == 1
    text = files[0].read_bytes()
    assert files[0].name == f"k_{hashlib.sha256(text).hexdigest()[:24]}.py"
    assert not [p for p in diskcache.folder().iterdir() if p.name.startswith(".tmp-")]
    assert b"@numba.njit(cache=True" in text
    # a damaged file is noticed (its text is compared) and written again, atomically
    files[0].write_bytes(text[: len(text) // 2])
    codegen._kernels.clear()
    fusion._plans.clear()
    both_modes(lambda: (x * 2 + 1).relu() - x)
    assert files[0].read_bytes() == text and adaptive.stats()["disk_writes"] == 2


def test_generated_source_shows_in_tracebacks():
    x = rand(8)
    both_modes(lambda: x * 3 - 1)
    (path,) = diskcache.folder().glob("k_*.py")
    kernel = next(k for k in codegen._kernels.values() if k is not codegen.FAILED)
    assert kernel.py_func.__code__.co_filename == str(path)  # a real file: pdb shows it


def test_unusable_folder_warns_once_and_compiles_in_memory(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # a folder below a file: fails even for root
    monkeypatch.setenv(diskcache.ENV, str(blocker / "kernels"))
    x, y = rand(30), rand(30, seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        both_modes(lambda: (x * 2 + y).abs())
        both_modes(lambda: torch.sigmoid(x - y) * 3)
    disk = [w for w in caught if "disk cache" in str(w.message)]
    assert len(disk) == 1, [str(w.message) for w in caught]
    assert "/tests/" in disk[0].filename  # (the user's line, not adaptive eager's)
    stats = adaptive.stats()
    assert stats["disk_fallbacks"] == 2 and stats["compiles"] == 2 and stats["disk_hits"] == 0


def test_off_switch(monkeypatch):
    monkeypatch.setenv(diskcache.ENV, "off")
    assert diskcache.folder() is None
    x = rand(16)
    both_modes(lambda: x * 2 + 1)
    stats = adaptive.stats()
    assert stats["compiles"] == 1 and stats["disk_writes"] == stats["disk_fallbacks"] == 0


def test_op_names_are_unique_definitions():
    assert all(op.name == name for name, op in E.OPS_BY_NAME.items())
    with pytest.raises(ValueError, match="two different elementwise ops"):
        E.Elementwise("mul", E.OPS_BY_NAME["add_plain"].fn)
    assert E.resolve(("op", "mul")) is E.OPS_BY_NAME["mul"].fn


def test_old_fingerprint_folders_are_pruned(tmp_path):
    """Once per process the folder in use is marked used and all but the KEEP most recently
    used other fingerprint folders go; anything else in the root stays."""
    root = tmp_path / "kernels"
    current = root / diskcache.fingerprint()
    current.mkdir(parents=True)
    old = []
    for k in range(diskcache.KEEP + 2):
        folder = root / f"{k:024x}"
        (folder / "__pycache__").mkdir(parents=True)
        (folder / f"k_{k:024x}.py").write_text("# a kernel\n")
        os.utime(folder, (1000 + k, 1000 + k))  # folder k used at time 1000 + k
        old.append(folder)
    mine = root / "my-notes"  # not a fingerprint folder
    mine.mkdir()
    odd = root / ("f" * 24)  # named like one, but holds something else
    odd.mkdir()
    (odd / "data.csv").write_text("1,2\n")
    removed = diskcache.prune(current)
    assert sorted(removed) == sorted(old[:2])  # the two least recently used
    assert all(f.exists() for f in old[2:]) and current.exists()
    assert mine.exists() and odd.exists()
