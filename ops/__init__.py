"""The kernel library: one op table (`registry.KERNELS`) filled by the family modules."""
from neuron_eager.ops import tensor  # noqa: F401  (renames PrivateUse1 first)
from neuron_eager.ops import router  # noqa: F401
from neuron_eager.ops import (  # noqa: F401
    activation,
    advanced_indexing,
    amp,
    arithmetic,
    attention,
    arrange,
    bags,
    conv,
    copy,
    factories,
    folds,
    foreach,
    gamma,
    grouped_mm,
    indexing,
    linalg,
    linalg_solve,
    loss,
    masking,
    matmul,
    norm,
    optim,
    poisson,
    pooling,
    power,
    products,
    random,
    recurrent,
    rnn_layers,
    reduction,
    reparam_grad,
    resampling,
    sampling,
    scan,
    selection,
    softmax,
    special,
    special_functions,
    unsupported,
    views,
)

from neuron_eager.ops import cpu_dtypes  # noqa: E402  (wraps kernels registered above)

cpu_dtypes.install()
