import numpy as np
import pytest
import torch
import torch.nn.functional as F

import neuron_eager
from checks import check_op
from neuron_eager.device_sim import core
from neuron_eager.ops import matmul

FLOATS = [torch.float32, torch.bfloat16]
# fp32 sums are taken in a different order than the CPU's BLAS: allow for K rounding steps.
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: {}, torch.float16: {}}


def _rand(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("mkn", [(1, 1, 1), (5, 7, 3), (33, 300, 17), (70, 128, 260),
                                 (16, 129, 8), (3, 0, 4)])
def test_mm(dtype, mkn, seed):
    m, k, n = mkn
    check_op(torch.mm, _rand(m, k, dtype=dtype), _rand(k, n, dtype=dtype), **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS)
def test_mm_transposed_and_sliced(dtype, seed):
    a, b = _rand(150, 40, dtype=dtype), _rand(60, 150, dtype=dtype)
    check_op(lambda x, y: torch.mm(x.t(), y.t()), a, b, **TOL[dtype])
    check_op(lambda x, y: torch.mm(x[::2, 1:30], y[3:32, ::3]), a, b, **TOL[dtype])
    check_op(lambda x: x.t() @ x, a, **TOL[dtype])  # both operands view the same storage


def test_mm_other_dtypes(seed):
    check_op(torch.mm, _rand(9, 140, dtype=torch.float16), _rand(140, 5, dtype=torch.float16))
    check_op(torch.mm, _rand(9, 40, dtype=torch.float64), _rand(40, 5, dtype=torch.float64))
    for dtype in (torch.int64, torch.int32, torch.int8, torch.uint8):
        a, b = torch.randint(0, 9, (7, 150), dtype=dtype), torch.randint(0, 9, (150, 6),
                                                                          dtype=dtype)
        check_op(torch.mm, a, b)  # exact, wrapping like the CPU for int8/uint8
    big = torch.full((2, 3), 2 ** 40, dtype=torch.int64)
    check_op(torch.mm, big, torch.ones(3, 2, dtype=torch.int64))  # int64 stays exact


@pytest.mark.parametrize("dtype", FLOATS)
def test_addmm_family(dtype, seed):
    c, a, b = _rand(6, 5, dtype=dtype), _rand(6, 200, dtype=dtype), _rand(200, 5, dtype=dtype)
    check_op(torch.addmm, c, a, b, **TOL[dtype])
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0.5, alpha=-2), c, a, b, **TOL[dtype])
    check_op(lambda c, a, b: torch.addmm(c[0], a, b, beta=3), c, a, b, **TOL[dtype])  # broadcast
    nan = torch.full((6, 5), float("nan"), dtype=dtype)
    check_op(lambda c, a, b: torch.addmm(c, a, b, beta=0), nan, a, b, **TOL[dtype])  # C ignored
    bc, ba, bb = _rand(3, 6, 5, dtype=dtype), _rand(3, 6, 130, dtype=dtype), \
        _rand(3, 130, 5, dtype=dtype)
    check_op(torch.bmm, ba, bb, **TOL[dtype])
    check_op(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2), bc, ba, bb, **TOL[dtype])
    check_op(lambda c, a, b: torch.addbmm(c[0], a, b, alpha=0.25), bc, ba, bb, **TOL[dtype])
    v, x = _rand(6, dtype=dtype), _rand(200, dtype=dtype)
    check_op(torch.mv, a, x, **TOL[dtype])
    check_op(lambda v, a, x: torch.addmv(v, a, x, beta=2, alpha=0.5), v, a, x, **TOL[dtype])
    check_op(torch.dot, x, x.flip(0), **TOL[dtype])
    check_op(torch.outer, v, x, **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", [((4, 5), (3, 5)), ((2, 4, 140), (7, 140)),
                                    ((2, 3, 4, 5), (6, 5))])
def test_linear(dtype, shapes, seed):
    x, w = _rand(*shapes[0], dtype=dtype), _rand(*shapes[1], dtype=dtype)
    b = _rand(shapes[1][0], dtype=dtype)
    for t in (x, w, b):
        t.requires_grad_(True)
    check_op(F.linear, x, w, b, grad=True, **TOL[dtype])
    check_op(F.linear, x, w, grad=True, **TOL[dtype])


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", [((5, 7), (7, 3)), ((2, 5, 7), (7, 3)), ((2, 5, 7), (2, 7, 3)),
                                    ((2, 1, 5, 140), (3, 140, 4)), ((4, 5, 7), (5, 1, 7, 3))])
def test_matmul_broadcasting(dtype, shapes, seed):
    a = _rand(*shapes[0], dtype=dtype).requires_grad_(True)
    b = _rand(*shapes[1], dtype=dtype).requires_grad_(True)
    check_op(torch.matmul, a, b, grad=True, **TOL[dtype])


def test_matmul_vectors(seed):
    a, v = _rand(5, 7), _rand(7)
    check_op(torch.matmul, a, v)  # mv
    check_op(torch.matmul, v, v)  # dot
    check_op(torch.matmul, v, a.t())  # unsqueeze, mm, squeeze_


def _chunked_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Note [PSUM accumulation], computed without BLAS's fp32 kernels: each 128-chunk summed
    in float64 (exact for _exact_chunk_operands), rounded to fp32, added in order in fp32."""
    acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
    for k0 in range(0, a.shape[1], 128):
        part = a[:, k0:k0 + 128].astype(np.float64) @ b[k0:k0 + 128].astype(np.float64)
        acc += part.astype(np.float32)
    return acc


def _exact_chunk_operands(m, k, n, dtype):
    """Small integers, A's scaled by 2^(s + u): s = 0 on even and -15 on odd 128-chunks of K,
    u per element in 0..8. Every partial sum inside a chunk is a multiple of 2^s below
    2^(s + 23): exact in fp32 in any order, so any fp32-accumulating BLAS gives the chunk
    sums exactly, while adding an odd chunk to the accumulator rounds."""
    s = -15 * ((torch.arange(k) // 128) % 2)
    a = torch.randint(-15, 16, (m, k)).float() * 2.0 ** (s + torch.randint(0, 9, (m, k)))
    b = torch.randint(-15, 16, (k, n)).float()
    return a.to(dtype), b.to(dtype)


# (9, 300, 11) runs np.dot (OpenBLAS) per chunk inside the Numba kernel, (140, 300, 170) and
# (64, 1024, 200) call MKL's sgemm through torch with beta=1, (24, 2100, 40) multiplies its
# chunks in one bmm (Note [Batched chunks]): all must give the reference's bits, so the chunk
# sums are added to the accumulator, not C preloaded into the chunk's sum.
@pytest.mark.parametrize("mkn", [(9, 300, 11), (140, 300, 170), (64, 1024, 200), (24, 2100, 40)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_k_chunked_accumulation_is_what_is_computed(dtype, mkn, seed):
    m, k, n = mkn
    a, b = _exact_chunk_operands(m, k, n, dtype)
    a32, b32 = a.float().numpy(), b.float().numpy()
    ref = _chunked_reference(a32, b32)
    for x, y in ((a, b), (a, b.t().contiguous().t())):  # a transposed operand too
        got = torch.mm(x.to("neuron"), y.to("neuron")).cpu()
        assert torch.equal(got, torch.from_numpy(ref).to(dtype))  # bit for bit
    flat = np.zeros_like(ref)
    for i in range(k):  # one long fp32 sum: must differ, or the test proves nothing
        flat += a32[:, i:i + 1] * b32[i:i + 1, :]
    assert not np.array_equal(flat, ref)
    if k > 256:  # nor one rounding of the exact sum (with two chunks, that is the same)
        assert not np.array_equal((a32.astype(np.float64) @ b32).astype(np.float32), ref)


def test_k_chunks_of_a_batch_are_added_in_order(seed):
    # one bmm per chunk over the batch, then the chunk sums added (ops/matmul.py _blas_gemm)
    pairs = [_exact_chunk_operands(40, 300, 50, torch.float32) for _ in range(4)]
    a, b = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    for x in (a, a.transpose(1, 2).contiguous().transpose(1, 2)):
        got = torch.bmm(x.to("neuron"), b.to("neuron")).cpu()
        for i in range(4):
            ref = _chunked_reference(a[i].numpy(), b[i].numpy())
            assert torch.equal(got[i], torch.from_numpy(ref))


@pytest.mark.parametrize("mkn", [(140, 1024, 170), (24, 2100, 200)])  # addmm_ / batched chunks
def test_a_product_in_parts_accumulates_its_chunks_in_order(mkn, seed):
    # gemm_values(..., accumulate=True), as conv's weight gradient uses it block by block: K
    # in two parts at a chunk boundary gives the one product's chunked sum, bit for bit
    from neuron_eager.ops.matmul import gemm_values

    m, k, n = mkn
    a, b = (t.numpy() for t in _exact_chunk_operands(m, k, n, torch.float32))
    res = np.empty(m * n, np.float32)
    cut = 512
    for part, (k0, k1) in enumerate(((0, cut), (cut, k))):
        gemm_values(res, (1, 1, 1, m, n, k1 - k0), a.reshape(-1)[k0:], (0, 0, 0, k, 1),
                    b.reshape(-1)[k0 * n:], (0, 0, 0, n, 1), accumulate=part > 0)
    assert np.array_equal(res.reshape(m, n), _chunked_reference(a, b))
    with pytest.raises(ValueError, match="accumulate"):  # a product off the sgemm path
        gemm_values(np.zeros(4, np.float32), (1, 1, 1, 2, 2, 3), a.reshape(-1), (0, 0, 0, 3, 1),
                    b.reshape(-1), (0, 0, 0, 2, 1), accumulate=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_out_dtype_returns_the_fp32_accumulator(dtype, seed):
    # mm(..., out_dtype=torch.float32): the PSUM sums themselves, not rounded to the inputs'
    # dtype (torch's CPU has no kernel for these overloads: the reference is the chunked sum)
    a, b = _exact_chunk_operands(9, 300, 11, dtype)
    ref = torch.from_numpy(_chunked_reference(a.float().numpy(), b.float().numpy()))
    A, B = a.to("neuron"), b.to("neuron")
    got = torch.mm(A, B, out_dtype=torch.float32)
    assert got.dtype == torch.float32 and torch.equal(got.cpu(), ref)
    assert not torch.equal(ref.to(dtype).float(), ref)  # rounding would show
    assert torch.equal(torch.mm(A, B, out_dtype=dtype).cpu(), torch.mm(A, B).cpu())
    out = torch.empty(9, 11, device="neuron")
    torch.mm(A, B, out_dtype=torch.float32, out=out)
    assert torch.equal(out.cpu(), ref)
    assert torch.equal(torch.bmm(A[None], B[None], out_dtype=torch.float32).cpu(), ref[None])
    for bias in (torch.randn(11), torch.randn(9, 11).to(dtype)):  # fp32 or the inputs' dtype
        want = ref.double() * 2 + bias.double() * 0.5
        got = torch.addmm(bias.to("neuron"), A, B, out_dtype=torch.float32, beta=0.5, alpha=2)
        torch.testing.assert_close(got.cpu().double(), want, rtol=1e-6, atol=1e-5)
        got = torch.baddbmm(bias.expand(1, 9, 11).to("neuron"), A[None], B[None],
                            out_dtype=torch.float32, beta=0.5, alpha=2)
        torch.testing.assert_close(got.cpu().double(), want[None], rtol=1e-6, atol=1e-5)


def test_out_dtype_refuses_what_torch_refuses(seed):
    a = torch.randn(4, 8, device="neuron")
    before = torch.neuron.memory_allocated()
    meta = torch.empty(4, 8, device="meta")  # the rule is torch's own (its meta kernel's)
    for x in (a, meta):
        with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype"):
            torch.mm(x.bfloat16(), x.bfloat16().t(), out_dtype=torch.float16)
        with pytest.raises(RuntimeError, match="out_dtype must be the same as input dtype"):
            torch.mm(x, x.t(), out_dtype=torch.bfloat16)
    assert torch.neuron.memory_allocated() == before


def test_small_products_run_with_one_openblas_thread(seed, monkeypatch):
    # Note [One BLAS thread]: the Numba kernel's np.dot runs with one OpenBLAS thread, and
    # OpenBLAS gets its own count back after
    from neuron_eager.ops import blas_threads
    calls = blas_threads._find()
    if calls is None:
        pytest.skip("no settable OpenBLAS under SciPy here")
    get, set_ = calls
    before = get()
    seen = []
    monkeypatch.setattr(blas_threads, "_calls", (get, lambda n: (seen.append(n), set_(n))))
    a, b = _rand(64, 192), _rand(192, 64)
    check_op(torch.mm, a, b, **TOL[torch.float32])
    assert get() == before
    if before != 1:
        assert seen[0] == 1 and seen[-1] == before
    seen.clear()
    big = _rand(256, 256)
    torch.mm(big.to("neuron"), big.to("neuron"))  # torch's MKL: its threads are left alone
    assert seen == []


def test_k_chunks_stay_fp32_when_torch_allows_bf16_matmuls(seed):
    # torch's CPU fp32 matmuls may then run in bf16 inside oneDNN: gemm must not use them
    a, b = _exact_chunk_operands(140, 300, 170, torch.float32)
    ref = torch.from_numpy(_chunked_reference(a.numpy(), b.numpy()))
    old = torch.backends.mkldnn.matmul.fp32_precision
    torch.backends.mkldnn.matmul.fp32_precision = "bf16"
    try:
        got = torch.mm(a.to("neuron"), b.to("neuron")).cpu()
    finally:
        torch.backends.mkldnn.matmul.fp32_precision = old
    assert torch.equal(got, ref)


@pytest.fixture
def cpu_bf16_gemm(monkeypatch):
    monkeypatch.setattr(neuron_eager.config, "bf16_gemm", "cpu")


def test_bf16_gemm_cpu_is_torchs_bf16_matmul(cpu_bf16_gemm, seed):
    # Note [bf16 GEMM]: the same library call on the same bytes as torch's CPU matmul
    a, b = _rand(140, 300, dtype=torch.bfloat16), _rand(300, 170, dtype=torch.bfloat16)
    for x, y in ((a, b), (a, b.t().contiguous().t()), (a.t().contiguous().t(), b)):
        got = torch.mm(x.to("neuron"), y.to("neuron")).cpu()
        assert torch.equal(got, torch.mm(x, y))
        torch.testing.assert_close(got, (x.float() @ y.float()).bfloat16())
    p, q = _rand(2, 3, 64, 96, dtype=torch.bfloat16), _rand(3, 96, 128, dtype=torch.bfloat16)
    got = torch.matmul(p.to("neuron"), q.to("neuron")).cpu()  # batched, broadcast over dim 0
    # bmm calls on the operands' own (strided) memory, where torch's matmul runs one bmm of
    # 6 on a copy: with AMX tiles oneDNN may block K otherwise (seen: 2 of 49152 results a
    # bf16 ulp apart), so batched products are compared within bf16's tolerance
    torch.testing.assert_close(got, torch.matmul(p, q))


def test_bf16_gemm_cpu_keeps_psum_where_it_cannot_apply(cpu_bf16_gemm, seed, monkeypatch):
    a, b = _exact_chunk_operands(140, 300, 170, torch.bfloat16)
    ref = torch.from_numpy(_chunked_reference(a.float().numpy(), b.float().numpy()))
    A, B = a.to("neuron"), b.to("neuron")
    took = []  # whether each product went to torch's bf16 GEMM (True) or stayed K-chunked
    bf16_gemm = matmul._bf16_blas_gemm
    monkeypatch.setattr(matmul, "_bf16_blas_gemm",
                        lambda *args: took.append(bf16_gemm(*args)) or took[-1])
    assert torch.equal(torch.mm(A, B).cpu(), torch.mm(a, b)) and took == [True]
    # with C (addmm, linear's bias) the fp32 accumulator is needed: the K-chunked kernel
    zero = torch.zeros(170, dtype=torch.bfloat16)
    assert torch.equal(torch.addmm(zero.to("neuron"), A, B).cpu(), ref.bfloat16())
    # and where the probe finds torch's bf16 sums are not fp32
    monkeypatch.setattr(matmul, "_bf16_gemm_sums_fp32", {True: False, False: False})
    assert torch.equal(torch.mm(A, B).cpu(), ref.bfloat16())
    assert took == [True, False, False]


def test_bf16_gemm_setting_is_checked():
    with pytest.raises(ValueError, match="NEURON_EAGER_BF16_GEMM"):
        neuron_eager.config.bf16_gemm = "fast"
    assert neuron_eager.config.bf16_gemm == "psum"


def test_stochastic_rounding_rounds_to_a_neighbour(seed):
    a, b = _exact_chunk_operands(16, 200, 24, torch.bfloat16)
    exact = torch.from_numpy(_chunked_reference(a.float().numpy(), b.float().numpy()))
    neuron_eager.config.stochastic_rounding = True
    try:
        got = torch.mm(a.to("neuron"), b.to("neuron")).cpu()
    finally:
        neuron_eager.config.stochastic_rounding = False
    low = (exact.view(torch.int32) >> 16).to(torch.int32)  # toward zero: |low| <= |exact|
    steps = got.view(torch.int16).to(torch.int32) - low.to(torch.int16).to(torch.int32)
    assert set(steps.unique().tolist()) <= {0, 1}
    assert (got != exact.bfloat16()).any()  # not round-to-nearest-even


def test_launch_counts_tensor_engine(seed):
    a, b = _rand(6, 130).to("neuron"), _rand(130, 4).to("neuron")
    core.reset_counters()
    torch.mm(a, b)
    assert core.launches_by_engine["tensor"] == 1
    assert core.elements_by_engine["tensor"] == 6 * 130 * 4


def test_errors_match_cpu():
    a, b = torch.randn(3, 4), torch.randn(5, 2)
    cases = [lambda x, y: torch.mm(x, y), lambda x, y: torch.mm(x, y.double()),
             lambda x, y: torch.bmm(x, y), lambda x, y: torch.mv(x, y[0]),
             lambda x, y: torch.mm(x.bool(), y.bool())]
    for fn in cases:
        with pytest.raises(RuntimeError) as cpu:
            fn(a, b)
        with pytest.raises(RuntimeError) as dev:
            fn(a.to("neuron"), b.to("neuron"))
        assert str(dev.value) == str(cpu.value)


def test_matmul_reports_its_shape_to_the_cost_model():
    a, b = torch.randn(5, 300, 70).to("neuron"), torch.randn(5, 70, 600).to("neuron")
    core.clock.start_recording()
    torch.bmm(a.bfloat16(), b.bfloat16())
    (record,) = [r for r in core.clock.stop_recording() if r.engine == "tensor"]
    assert record.cost == core.cost_model.cost("tensor", 5 * 300 * 70 * 600, record.nbytes,
                                               matmul=(5, 300, 70, 600), dtype="bf16")


def _grouped_cases(dtype):
    """torch._grouped_mm's four forms (ops/grouped_mm.py), with CPU-valid layouts."""
    ends = lambda *e: torch.tensor(e, dtype=torch.int32)  # noqa: E731
    experts_t = _rand(3, 12, 8, dtype=dtype).transpose(1, 2)  # column-major: N=12 pads
    return [
        (_rand(10, 8, dtype=dtype), _rand(3, 8, 16, dtype=dtype), ends(3, 7, 10)),
        (_rand(10, 8, dtype=dtype), experts_t, ends(0, 6, 9)),  # an empty group, a row left
        (_rand(4, 24, dtype=dtype), _rand(12, 24, dtype=dtype).t(), ends(8, 16, 24)),
        (_rand(3, 4, 8, dtype=dtype), _rand(8, 24, dtype=dtype), ends(8, 16, 24)),
        (_rand(3, 5, 8, dtype=dtype), experts_t, None),
    ]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_grouped_mm_forms_match_the_cpu(dtype, seed):
    for a, b, offs in _grouped_cases(dtype):
        kw = {} if offs is None else {"offs": offs}
        want = torch._grouped_mm(a, b, **kw)
        if offs is not None and a.dim() == 2 and b.dim() == 3:
            want[offs[-1]:] = 0  # rows no group covers: uninitialised on the CPU, zeros here
        neuron_eager.clear_op_tracking()
        got = torch._grouped_mm(a.to("neuron"), b.to("neuron"),
                                **{k: v.to("neuron") for k, v in kw.items()})
        assert got.stride() == want.stride()  # the CPU's padded rows
        torch.testing.assert_close(got.cpu(), want, **TOL[dtype])
        assert neuron_eager.get_fallback_ops() == {}


def test_grouped_mm_backward_matches_the_cpu(seed):
    a, b, offs = _grouped_cases(torch.float32)[0]
    check_op(lambda x, w, o: torch._grouped_mm(x, w.transpose(1, 2), offs=o),
             a.requires_grad_(), b.transpose(1, 2).contiguous().requires_grad_(), offs,
             grad=True, **TOL[torch.float32])


def test_grouped_mm_errors_match_the_cpu():
    x, w = _rand(10, 8, dtype=torch.bfloat16), _rand(3, 8, 16, dtype=torch.bfloat16)
    offs = torch.tensor([3, 7, 9], dtype=torch.int32)
    bad = [lambda d: (x.to(d), w.float().to(d), offs.to(d)),
           lambda d: (x.long().to(d), w.to(d), offs.to(d)),
           lambda d: (x.to(d), w.transpose(1, 2).to(d), offs.to(d)),
           lambda d: (x.to(d), w.to(d), offs.view(3, 1).to(d)),
           lambda d: (x.to(d), w[:2].to(d), offs.to(d)),
           lambda d: (x[:, :7].contiguous().to(d), w[:, :7].to(d), offs.to(d)),  # 14-byte rows
           lambda d: (x.to(d)[:, ::2], w.to(d)[:, ::2], offs.to(d)),
           lambda d: (x[:, None].to(d), w.to(d), offs.to(d)),
           lambda d: (x.to(d), w.to(d), offs.long().to(d))]
    for args in bad:
        with pytest.raises(RuntimeError) as cpu_error:
            torch._grouped_mm(*args("cpu")[:2], offs=args("cpu")[2])
        with pytest.raises(RuntimeError) as ours:
            torch._grouped_mm(*args("neuron")[:2], offs=args("neuron")[2])
        assert str(ours.value) == str(cpu_error.value)
    with pytest.raises(RuntimeError, match="output dtype must match"):
        torch._grouped_mm(x.to("neuron"), w.to("neuron"), offs=offs.to("neuron"),
                          out_dtype=torch.float32)
