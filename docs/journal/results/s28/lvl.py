import json, zlib, time
from ckptzip import container
for mode in ("bitsnap", "excp", "adaptive"):
    data = open(f"/tmp/s28/demo/{mode}.ckz", "rb").read()
    pre = container.parse_prelude(data[:container.PRELUDE_SIZE], len(data), "x")
    raw = container.load_header(data[container.PRELUDE_SIZE:container.PRELUDE_SIZE + pre.header_length], pre.flags, "x")
    out = []
    for lvl in (1, 3, 5, 6, 9):
        t = time.perf_counter(); 
        for _ in range(5): z = zlib.compress(raw, lvl)
        out.append(f"L{lvl}: {len(z)} {1e3*(time.perf_counter()-t)/5:.1f}ms")
    print(mode, len(raw), " | ".join(out))
