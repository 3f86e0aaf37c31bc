"""torch.load with map_location naming neuron (Note [Loading onto neuron])."""
import copy
import io
import pickle

import pytest
import torch

import neuron_eager  # noqa: F401

N = torch.device("neuron", 0)


def _saved(obj) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


@pytest.mark.parametrize("where", ["neuron", "neuron:0", N, {"cpu": "neuron"},
                                   lambda storage, loc: storage.neuron(),  # (CUDA's idiom)
                                   lambda storage, loc: storage.neuron(0)])
@pytest.mark.parametrize("weights_only", [True, False])
def test_a_cpu_checkpoint_loads_onto_neuron(where, weights_only):
    sd = {"w": torch.randn(3, 4), "b": torch.randn(4).bfloat16(), "n": torch.tensor(7)}
    loaded = torch.load(_saved(sd), map_location=where, weights_only=weights_only)
    for key, value in sd.items():
        assert loaded[key].device == N
        assert loaded[key].dtype == value.dtype
        assert torch.equal(loaded[key].cpu(), value)


def test_a_storage_outside_torch_load_cannot_go_to_neuron():
    with pytest.raises(RuntimeError, match="a storage cannot be made on its own on neuron"):
        torch.UntypedStorage(4).neuron()


def test_views_keep_sharing_memory_and_parameters_stay_parameters():
    t = torch.arange(10.0)
    p = torch.nn.Parameter(torch.randn(2, 3))
    loaded = torch.load(_saved({"t": t, "v": t[2:5], "p": p}), map_location="neuron")
    loaded["t"][3] = 100  # as on the CPU: the view sees it
    assert loaded["v"].cpu().tolist() == [2.0, 100.0, 4.0]
    assert isinstance(loaded["p"], torch.nn.Parameter) and loaded["p"].requires_grad
    assert loaded["p"].is_leaf and torch.equal(loaded["p"].detach().cpu(), p.detach())


@pytest.mark.parametrize("weights_only", [True, False])
def test_the_legacy_format_loads_its_values_onto_neuron(weights_only):
    # (Note [Legacy checkpoints]: its tensors are rebuilt before their bytes are read)
    sd = {"w": torch.randn(3, 4), "v": torch.arange(6.0)[1:4], "n": torch.tensor(7)}
    for saved, where in ((sd, "neuron"), ({k: v.to(N) for k, v in sd.items()}, None)):
        buf = io.BytesIO()
        torch.save(saved, buf, _use_new_zipfile_serialization=False)
        buf.seek(0)
        loaded = torch.load(buf, map_location=where, weights_only=weights_only)
        for key, value in sd.items():
            assert loaded[key].device == N
            assert torch.equal(loaded[key].cpu(), value)


def test_a_neuron_model_round_trips_with_every_map_location():
    model = torch.nn.Linear(3, 2).to(N)
    buf = _saved(model.state_dict())
    for where, device in ((None, N), ("neuron", N), ("cpu", torch.device("cpu"))):
        buf.seek(0)
        loaded = torch.load(buf, map_location=where)
        for key, value in model.state_dict().items():
            assert loaded[key].device == device
            assert torch.equal(loaded[key].cpu(), value.cpu())


def test_a_device_that_does_not_exist_is_refused():
    with pytest.raises(RuntimeError, match="neuron device 3 but torch.neuron.device_count"):
        torch.load(_saved({"w": torch.ones(2)}), map_location="neuron:3")


def test_other_loads_are_untouched():
    sd = {"w": torch.randn(3)}
    loaded = torch.load(_saved(sd), map_location="cpu")
    assert loaded["w"].device.type == "cpu" and torch.equal(loaded["w"], sd["w"])
    # the marks stay on storages of neuron loads only: a later CPU load of the same bytes
    again = torch.load(_saved(sd))
    assert again["w"].device.type == "cpu"


def test_storages_tell_which_tensors_share_memory():
    # safetensors and transformers' save_pretrained group a state dict by
    # (device, untyped_storage().data_ptr(), nbytes) to find tied weights; on the CPU the
    # groups are: the tied pair, and each other tensor alone. The same must hold on neuron.
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10))
    model[1].weight = model[0].weight  # tied, as a language model's head and embedding

    def groups(m):
        found = {}
        for name, t in m.state_dict().items():
            s = t.untyped_storage()
            found.setdefault((t.device, s.data_ptr(), s.nbytes()), []).append(name)
        return sorted(sorted(names) for names in found.values())

    on_cpu = groups(model)
    assert on_cpu == [["0.weight", "1.weight"], ["1.bias"]]
    device_model = model.to("neuron")
    assert groups(device_model) == on_cpu
    w = device_model[0].weight
    # views: one memory, and a view's first element lies inside it, as on the CPU
    s, row = w.untyped_storage(), w[3]
    assert row.untyped_storage().data_ptr() == s.data_ptr()
    assert s.data_ptr() <= row.data_ptr() < s.data_ptr() + s.nbytes()
    assert w.data_ptr() == s.data_ptr() and s.nbytes() == w.numel() * w.element_size()
    assert w.storage().data_ptr() == s.data_ptr()  # the TypedStorage path (older safetensors)


def test_storages_print_index_and_set_like_the_cpus():
    cpu = torch.arange(6, dtype=torch.float32)
    dev = cpu.to("neuron")
    s, c = dev.untyped_storage(), cpu.untyped_storage()
    assert repr(s) == repr(c).replace("device=cpu", "device=neuron:0")
    assert s.tolist() == c.tolist() and s[5] == c[5]
    view = torch.empty(0, device="neuron").set_(s, 2, (2, 2))
    assert torch.equal(view.cpu(), torch.empty(0).set_(c, 2, (2, 2)))
    view.add_(1)  # the same memory
    assert dev[2:].tolist() == [3.0, 4.0, 5.0, 6.0]
    with pytest.raises(RuntimeError, match="out of bounds for storage of size 24"):
        torch.empty(0, device="neuron").set_(s, 4, (3,))
    with pytest.raises(RuntimeError):
        torch.empty(0).set_(c, 4, (3,))  # the CPU refuses too (its tensors' storages are fixed)
    assert neuron_eager.get_fallback_ops() == {}


def test_storage_copies_fills_and_moves_like_the_cpus():
    # (each raised "Attempted to call copy_() on an invalid python storage")
    results = []
    for device in ("cpu", "neuron"):
        w, w2 = torch.arange(4.0, device=device), torch.zeros(4, device=device)
        w2.untyped_storage().copy_(w.untyped_storage())
        after_copy = w2.tolist()
        w2.untyped_storage().copy_(torch.arange(4.0).add(7).untyped_storage())  # (from the host)
        after_host_copy = w2.tolist()
        w2.untyped_storage().fill_(300)  # (bytes: 300 is 44)
        moved = w.untyped_storage().to(device="cpu")
        with pytest.raises(RuntimeError, match="size does not match"):
            w2.untyped_storage().copy_(torch.zeros(2, device=device).untyped_storage())
        results.append((after_copy, after_host_copy, w2.view(torch.uint8).tolist(),
                        moved.device.type, moved.tolist(), w.untyped_storage().new().device.type))
    assert results[1] == (*results[0][:5], "neuron")


def test_the_storage_of_a_view_is_its_whole_memory():
    """A view's storage is the whole memory, as the CPU's: a view from offset 0 that ends
    early gave a storage whose len() and indexing stopped where the view did."""
    cpu = torch.arange(12, dtype=torch.float32).reshape(4, 3)
    dev = cpu.to("neuron")
    for view in (slice(None, 1), slice(1, None)):
        s, c = dev[view].untyped_storage(), cpu[view].untyped_storage()
        assert len(s) == len(c) == s.nbytes() == 48
        assert s[47] == c[47] and s.tolist() == c.tolist()
        assert str(s) == str(c).replace("device=cpu", "device=neuron:0")
        assert s.data_ptr() == dev.untyped_storage().data_ptr()


@pytest.mark.parametrize("weights_only", [True, False])
def test_saved_neuron_tensors_keep_sharing_memory_as_on_cuda(weights_only):
    """Note [Saving storages]: one storage per memory, tagged neuron:0; tied weights and
    views load sharing memory again, on neuron (or on the CPU with map_location="cpu")."""
    for device in ("cpu", "neuron"):
        m = torch.nn.Linear(4, 4).to(device)
        emb = torch.nn.Embedding(4, 4).to(device)
        emb.weight = m.weight  # tied
        x = torch.arange(12.0, device=device)
        saved = {"m": m.state_dict(), "emb": emb.weight, "x": x, "v": x[2:6].view(2, 2),
                 "h": torch.ones(3, dtype=torch.bfloat16, device=device)}
        buf = _saved(saved)
        size = buf.getbuffer().nbytes
        loaded = torch.load(buf, weights_only=weights_only)
        assert loaded["x"].device.type == device and loaded["h"].dtype == torch.bfloat16
        assert isinstance(loaded["emb"], torch.nn.Parameter)
        loaded["x"][3] = 100
        assert loaded["v"][0, 1].item() == 100
        loaded["m"]["weight"][0, 0] = 7
        assert loaded["emb"][0, 0].item() == 7
        if device == "cpu":
            cpu_size = size
    assert size == pytest.approx(cpu_size, rel=0.05)  # tied weights written once, as on CPU
    on_cpu = torch.load(_saved(saved), map_location="cpu", weights_only=weights_only)
    assert on_cpu["x"].device.type == "cpu"
    assert on_cpu["v"].untyped_storage().data_ptr() == on_cpu["x"].untyped_storage().data_ptr()


def test_pickle_outside_torch_save_still_copies_each_tensor():
    import pickle

    x = torch.arange(6.0, device="neuron")
    back = pickle.loads(pickle.dumps([x, x[1:3]]))
    assert back[0].device.type == "neuron" and back[1].cpu().tolist() == [1.0, 2.0]


def test_neuron_tensors_are_not_shared_with_other_processes():
    # hogwild's model.share_memory() passed, and a forked child's updates never reached the
    # parent; a spawned child failed inside torch's shared-file code
    from multiprocessing.reduction import ForkingPickler

    model = torch.nn.Linear(2, 2).to(N)
    assert not model.weight.is_shared()
    with pytest.raises(RuntimeError, match="cannot be shared with or sent to another process"):
        model.share_memory()
    with pytest.raises(RuntimeError, match="cannot be shared with or sent to another process"):
        ForkingPickler.dumps(model.weight)
    assert torch.equal(pickle.loads(pickle.dumps(model.weight)).cpu(), model.weight.cpu())


@pytest.mark.parametrize("weights_only", [True, False])
def test_attributes_a_user_set_on_a_parameter_are_kept(weights_only):
    """`p.no_decay = True` survives torch.save/torch.load and pickle as on the CPU, and so
    do a plain tensor's attributes (torch.save and pickle dropped them)."""
    results = []
    for device in ("cpu", "neuron"):
        model = torch.nn.Linear(2, 2).to(device)
        model.weight.no_decay, model.bias.group = True, "bias"
        buffer = io.BytesIO()
        torch.save(model.weight, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=weights_only)
        copied = copy.deepcopy(model)
        pickled = pickle.loads(pickle.dumps(model.bias))
        t = torch.ones(2, device=device)
        t.tag = {"scale": 0.5}
        buffer = io.BytesIO()
        torch.save({"t": t}, buffer)
        buffer.seek(0)
        t_loaded = torch.load(buffer, weights_only=weights_only)["t"]
        results.append((loaded.no_decay, loaded.device.type, loaded.requires_grad,
                        getattr(copied.weight, "no_decay", None), pickled.group,
                        copy.deepcopy(t).tag,  # (deepcopy drops a Parameter's attributes)
                        t_loaded.tag, t_loaded.device.type, pickle.loads(pickle.dumps(t)).tag))
    assert results[1] == (*results[0][:1], "neuron", *results[0][2:7], "neuron",
                          *results[0][8:])


def test_copy_copy_shares_memory_as_on_the_cpu():
    # (it copied the memory: the copy's writes did not reach the original)
    results = []
    for device in ("cpu", "neuron"):
        t = torch.arange(3.0, device=device).requires_grad_().t()
        t.tag = "x"
        p = torch.nn.Parameter(torch.ones(2, device=device))
        p.group = "bias"
        t2, p2 = copy.copy(t), copy.copy(p)
        with torch.no_grad():
            t2.add_(10)
            p2.add_(1)
        results.append((t.tolist(), t2.requires_grad, t2.is_leaf, t2.tag, p.tolist(),
                        isinstance(p2, torch.nn.Parameter), p2.group))
    assert results[0] == results[1]


def test_pickle_and_numpy_force_keep_a_dense_layout_as_on_the_cpu():
    # (both came back contiguous: a transposed tensor's strides and channels-last were lost)
    for make in (lambda d: torch.arange(6.0, device=d).view(2, 3).t(),
                 lambda d: torch.arange(24.0, device=d).view(1, 2, 3, 4).contiguous(
                     memory_format=torch.channels_last)):
        cpu, dev = make("cpu"), make("neuron")
        back = pickle.loads(pickle.dumps(dev))
        assert back.device.type == "neuron" and back.stride() == \
            pickle.loads(pickle.dumps(cpu)).stride()
        assert torch.equal(back.cpu(), cpu)
        assert dev.numpy(force=True).strides == cpu.numpy(force=True).strides
