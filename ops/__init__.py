"""The kernel library: one op table (`registry.KERNELS`) filled by the family modules."""
from neuron_eager.ops import tensor  # noqa: F401  (renames PrivateUse1 first)
from neuron_eager.ops import router  # noqa: F401
from neuron_eager.ops import (  # noqa: F401
    activation,
    arithmetic,
    arrange,
    conv,
    copy,
    factories,
    foreach,
    indexing,
    loss,
    masking,
    matmul,
    norm,
    pooling,
    random,
    recurrent,
    reduction,
    sampling,
    scan,
    softmax,
    special,
    unsupported,
    views,
)
