"""A child forked while another thread is inside the simulator runs (Note [Forking with
threads] in device_sim/forks.py)."""
import subprocess
import sys

_FORK_WHILE_HELD = r"""
import faulthandler, os, threading
import torch, neuron_eager
from numba.core.compiler_lock import global_compiler_lock
from neuron_eager.adaptive import recording
from neuron_eager.device_sim import core
neuron_eager.adaptive.enable()
held, done = threading.Event(), threading.Event()

def hold():  # another thread inside a recording, an allocation and a compile
    with recording._lock, core.hbm._lock, global_compiler_lock:
        held.set()
        done.wait()

threading.Thread(target=hold).start()
held.wait()
pid = os.fork()
if pid == 0:
    faulthandler.dump_traceback_later(120, exit=True)  # (hung: exit code 1)
    x = torch.arange(6.0, device="neuron")
    y = (x * 2 + 1).exp2().sum()  # (a region to compile)
    os._exit(0 if y.item() == sum(2.0 ** (2 * k + 1) for k in range(6)) else 2)
code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
done.set()
print("child", code)
"""


def test_a_child_forked_while_another_thread_holds_our_locks_runs():
    # (Note [Forking with threads] in device_sim/forks.py): the child waited forever
    run = subprocess.run([sys.executable, "-c", _FORK_WHILE_HELD], capture_output=True,
                         text=True, timeout=300)
    assert run.stdout.strip() == "child 0", run.stdout + run.stderr
