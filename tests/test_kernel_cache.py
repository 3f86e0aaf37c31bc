"""Plain eager's kernels on disk (ops/jit.py): a second process loads every kernel it ran
and compiles none, with the same results; keys tell functions apart by their constants and
closures, and stay the same across processes."""
import json
import os
import subprocess
import sys
import textwrap

import torch

from neuron_eager.ops import jit

PROGRAM = textwrap.dedent("""
    import json
    import torch, neuron_eager

    torch.manual_seed(0)
    x = torch.randn(16, 40)
    w = torch.randn(40, 24, requires_grad=True)
    h = torch.randn(16, 24).to(torch.bfloat16)
    xn, wn = x.to("neuron"), w.detach().to("neuron").requires_grad_()
    y = torch.nn.functional.gelu(xn @ wn).softmax(-1)
    z = torch.nn.functional.layer_norm(y, (24,)) * h.to("neuron") + 1
    z.float().sum().backward()
    a = (x[:4, :4] @ x[:4, :4].T).to("neuron") + torch.eye(4, device="neuron")
    inv = torch.linalg.inv(a)  # LAPACK by symbol (Note [LAPACK by symbol])
    steps = torch.arange(0, 1, 0.125, device="neuron") + torch.linspace(0, 1, 8, device="neuron")
    out = [z.float().cpu(), wn.grad.cpu(), inv.cpu(), steps.cpu()]
    print(json.dumps(dict(neuron_eager.kernel_cache_stats(), folder=None,
                          bits=[t.view(torch.int32).flatten().tolist() for t in out])))
""")


def _run(tmp_path) -> dict:
    script = tmp_path / "program.py"
    script.write_text(PROGRAM)
    env = dict(os.environ, NEURON_EAGER_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_second_process_loads_plain_kernels_and_compiles_none(tmp_path):
    first, second = _run(tmp_path), _run(tmp_path)
    assert first["compiled"] > 10 and first["loaded"] == 0
    # (helpers that were compiled inside a kernel need no loading: its machine code has them)
    assert second["compiled"] == 0 and 10 < second["loaded"] <= first["compiled"]
    assert second["bits"] == first["bits"]
    assert list((tmp_path / "kernels").glob("*/plain/*.nbi"))


def test_keys_see_constants_and_closure_contents():
    one, two = (lambda x: x + 1), (lambda x: x + 2)  # same bytecode, other constants
    assert jit.function_key(one) != jit.function_key(two)

    def make(k):
        return lambda x: x * k

    assert jit.function_key(make(2.0)) == jit.function_key(make(2.0))
    assert jit.function_key(make(2.0)) != jit.function_key(make(3.0))


def test_keys_see_which_native_function_a_call_names():
    # Note [Native calls by symbol]: the address is not part of a key (it changes with every
    # process), the symbol and the argument count are
    import ctypes
    address = ctypes.cast(ctypes.CDLL(None).getpid, ctypes.c_void_p).value
    calls = [jit.native_call(name, address, n) for name, n in
             (("neuron_eager_test_a", 0), ("neuron_eager_test_a", 0), ("neuron_eager_test_b", 0),
              ("neuron_eager_test_a", 1))]
    keys = [jit._describe(c, {}) for c in calls]
    assert keys[0] == keys[1] and len({keys[0], keys[2], keys[3]}) == 3


def test_keys_of_factory_kernels_are_the_same_in_another_process():
    """A closure over jitted loaders (pickled, a Numba function carries a random id) keys the
    same in every process, or a second process would never find it."""
    code = ("from neuron_eager.ops import jit, numerics; "
            "print(jit.function_key(numerics.loader('bf16', 'f32')))")
    keys = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, timeout=300).stdout.split()[-1] for _ in range(2)}
    from neuron_eager.ops import numerics

    assert keys == {jit.function_key(numerics.loader("bf16", "f32"))}


def test_keys_see_rebound_globals():
    """reduction.specialize copies a template with other globals (load/store): same code,
    other machine code, so other keys."""
    from neuron_eager.ops import reduction

    f32 = reduction.kernel("sum", torch.float32, torch.float32, "f32")
    bf16 = reduction.kernel("sum", torch.bfloat16, torch.bfloat16, "f32")
    assert f32.py_func.__code__ is bf16.py_func.__code__
    assert jit.function_key(f32.py_func) != jit.function_key(bf16.py_func)
    assert jit.function_key(f32.py_func) == jit.function_key(
        reduction.specialize(reduction.FAMILIES["sum"], **{
            k: f32.py_func.__globals__[k] for k in ("load", "store", "cast")}).py_func)


ONE_OP = textwrap.dedent("""
    import sys, torch, neuron_eager
    a = torch.ones(5, device="neuron")
    (a * 3 if sys.argv[1] == "mul" else a / 3).cpu()  # compiles (and caches) one op's function
""")
BOTH = textwrap.dedent("""
    import torch, neuron_eager
    from neuron_eager import adaptive
    x = torch.linspace(-2, 2, 64).reshape(8, 8)
    def chain(t):
        return (t * 3 + 1) / (t * t + 2)
    expected = chain(x.to("neuron")).cpu()  # op by op
    adaptive.enable()
    for _ in range(3):
        fused = chain(x.to("neuron")).cpu()  # one kernel calling mul and div
    print(torch.equal(fused, expected), torch.allclose(fused, chain(x)))
""")


def test_functions_of_one_name_cached_by_two_processes_stay_apart(tmp_path):
    """mul's and div's scalar functions are both `<lambda>` in arithmetic.py: compiled in
    two processes, then loaded together into a third, each must keep its own machine code
    (Note [Symbols across processes])."""
    env = dict(os.environ, NEURON_EAGER_CACHE_DIR=str(tmp_path / "kernels"))
    for name, program, args in [("one.py", ONE_OP, ["mul"]), ("one.py", ONE_OP, ["div"]),
                                ("both.py", BOTH, [])]:
        (tmp_path / name).write_text(program)
        done = subprocess.run([sys.executable, str(tmp_path / name), *args], env=env,
                              capture_output=True, text=True, timeout=600, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "True"]


THREADS = textwrap.dedent("""
    import threading, warnings
    import torch, neuron_eager
    warnings.simplefilter("error", RuntimeWarning)  # "the kernel disk cache ... is not usable"
    errors = []
    def work():
        try:
            x = torch.linspace(-1, 1, 100, device="neuron")
            (x.exp() * 2 + x.sin() - x.abs()).cpu()
        except Exception as e:
            errors.append(repr(e))
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(errors)
""")


def test_threads_sharing_a_new_cache_folder_load_whole_modules(tmp_path):
    """Several threads making the same new kernels at once: none may take another's
    half-run kernel module (it warned that the folder was not usable)."""
    script = tmp_path / "threads.py"
    script.write_text(THREADS)
    env = dict(os.environ, NEURON_EAGER_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "[]" and "not usable" not in done.stderr


def test_overloads_saved_by_two_processes_keep_their_own_code(tmp_path):
    # Note [Cache files across processes] in ops/_compat.py: Numba named data files by the
    # first free serial number, so two processes saving at once could map one signature to
    # the other's code. Files are named by their key now, and the index is merged under a
    # lock: a second "process" (another cache file object) keeps the first's entry.
    from numba.core import caching

    from neuron_eager.ops import _compat

    def process():
        cache_file = caching.IndexDataCacheFile(str(tmp_path), "kernel-1.py311", None)
        cache_file.__class__ = _compat._keyed_index_file_class()
        return cache_file

    first, second = process(), process()
    first.save(("int64[:]",), b"code for int64")
    second.save(("bool[:]",), b"code for bool")
    third = process()
    assert third.load(("int64[:]",)) == b"code for int64"
    assert third.load(("bool[:]",)) == b"code for bool"
    names = {p.name for p in tmp_path.iterdir() if p.suffix == ".nbc"}
    assert len(names) == 2 and not any(".1.nbc" in n for n in names)
    second.save(("int64[:]",), b"code for int64")  # the same key: the same file again
    assert {p.name for p in tmp_path.iterdir() if p.suffix == ".nbc"} == names


GONE = textwrap.dedent("""
    import os, shutil, sys
    import torch, neuron_eager

    root = os.environ["NEURON_EAGER_CACHE_DIR"]
    x = torch.rand(8) + 0.5
    (x.to("neuron") + 1).cpu()
    for name in os.listdir(root):  # the folder goes (another version pruned it) ...
        shutil.rmtree(os.path.join(root, name))
        open(os.path.join(root, name), "w").close()  # ... and cannot come back
    for op in (torch.special.i0, torch.digamma, lambda t: torch.cumprod(t, 0)):
        assert torch.allclose(op(x.to("neuron")).cpu(), op(x)), op
    print("ran")
""")


def test_a_cache_folder_that_goes_away_warns_and_compiles_in_memory(tmp_path):
    # Note [A cache folder that goes away] in ops/_compat.py
    script = tmp_path / "gone.py"
    script.write_text(GONE)
    env = dict(os.environ, NEURON_EAGER_CACHE_DIR=str(tmp_path / "kernels"))
    done = subprocess.run([sys.executable, "-W", "always", str(script)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and done.stdout.split() == ["ran"], done.stderr
    warned = [line for line in done.stderr.splitlines()
              if "could not be read from or written to the disk cache" in line]
    assert warned and warned[0].startswith(f"{script}:")  # (it names the user's line)


def test_an_unusable_cache_folder_warns_at_the_users_line(tmp_path):
    (tmp_path / "file").write_text("")  # the folder cannot be made inside a file
    script = tmp_path / "unusable.py"
    script.write_text("import torch, neuron_eager\n"
                      "print(torch.special.i0(torch.ones(3, device='neuron')).cpu().tolist())\n")
    env = dict(os.environ, NEURON_EAGER_CACHE_DIR=str(tmp_path / "file" / "kernels"))
    done = subprocess.run([sys.executable, "-W", "always", str(script)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == str(torch.special.i0(torch.ones(3)).tolist())
    warned = [line for line in done.stderr.splitlines() if "compile in every process" in line]
    assert warned and warned[0].startswith(f"{script}:")
