"""`torch.compile(model, backend="neuron")`: the device's TorchDynamo backend, by name.

A first backend, not yet a compiler: the graph Dynamo captures runs as traced, op by op
through the device's kernels, so results are eager's (and under adaptive eager its
elementwise runs still fuse). It is registered under the name libraries ask for: Hugging
Face transformers compiles a neuron model's forward with `backend="neuron"` when
`generate(..., cache_implementation="static")` runs, which failed with InvalidBackend. Dynamo
finds it through the `torch_dynamo_backends` entry point in pyproject.toml, so importing
torch._dynamo does not wait for neuron_eager and neither waits for the other.
"""
from __future__ import annotations


def neuron_backend(graph_module, example_inputs):
    """TorchDynamo backend: run the captured FX graph as it is (see the module docstring)."""
    import neuron_eager  # noqa: F401  (the device, should the graph be compiled before import)

    return graph_module.forward
