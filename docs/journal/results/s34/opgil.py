import ctypes, torch, numpy as np
gc = ctypes.CDLL("/tmp/s34/gilcount/gc.so")
t = torch.ones(1000); b = torch.ones(10, 100)
ops = {
 "is_cpu": lambda: t.is_cpu, "numel": lambda: t.numel(), "dtype": lambda: t.dtype, "shape": lambda: t.shape,
 "reshape": lambda: t.reshape(-1), "reshape2": lambda: b.reshape(-1), "contiguous": lambda: t.contiguous(), "numpy": lambda: t.numpy(),
 "detach": lambda: t.detach(), "element_size": lambda: t.element_size(), "to_same": lambda: t.to(torch.float32),
 "view": lambda: t.view(torch.int32), "slice": lambda: t[1:5], "is_contiguous": lambda: t.is_contiguous(),
 "float": lambda: t.float(), "double": lambda: t.double(), "item0": lambda: t[0].item(), "float()": lambda: float(t[0]),
 "empty": lambda: torch.empty(10), "from_numpy": lambda: torch.from_numpy(np.ones(3)), "cpu": lambda: t.cpu(),
 "nbytes": lambda: t.nbytes, "data_ptr": lambda: t.data_ptr(), "device": lambda: t.device, "size0": lambda: t.size(0),
 "np.asarray": lambda: np.asarray(t), "requires_grad": lambda: t.requires_grad, "storage_offset": lambda: t.storage_offset(),
 "stride": lambda: t.stride(), "dim": lambda: t.dim(), "untyped_storage": lambda: t.untyped_storage(),
}
for name, fn in ops.items():
    gc.gilcount_reset()
    for _ in range(100): fn()
    gc.gilcount_report(name.encode())
