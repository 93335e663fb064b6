import ctypes, torch, numpy as np
gc = ctypes.CDLL("/tmp/s34/gilcount/gc.so")
t = torch.ones(1000); b = torch.ones(10, 100); s = torch.tensor(1.0)
ops = {"is_conj": lambda: t.is_conj(), "is_neg": lambda: t.is_neg(), "resolve_conj": lambda: t.resolve_conj(),
 "numpy().reshape": lambda: b.numpy().reshape(-1), "0d numpy reshape view": lambda: s.numpy().reshape(-1).view(np.uint8),
 "promote_types": lambda: torch.promote_types(t.dtype, torch.float32), "double on double": lambda: t.double().double(),
 "torch.tensor": lambda: torch.tensor([1.0, 2.0]), "from_numpy": lambda: torch.from_numpy(np.ones(3)),
 "is_cuda": lambda: t.is_cuda, "new_zeros": lambda: t.new_zeros(1), "cat": lambda: torch.cat([t, t]),
 "a+b": lambda: t + t, "abs": lambda: t.abs(), "sum": lambda: t.sum(), "float(sum)": lambda: float(t.sum()),
 "getitem int": lambda: t[3], "view_as_real?": lambda: t.flatten(), "log": lambda: t.log(), "exp": lambda: t.exp(),
 "searchsorted": lambda: torch.searchsorted(t, t[:5]), "int(tensor)": lambda: int(t[3]),
}
for name, fn in ops.items():
    gc.gilcount_reset()
    for _ in range(100): fn()
    gc.gilcount_report(name.encode())
