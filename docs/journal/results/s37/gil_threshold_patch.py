"""Session 37 probe (reverted): let the GIL go only around native work of 64 KiB or more, at the
bindings' call sites of module.c at HEAD 1ae2570. Paired saves showed no change (see the journal)."""
import re
p = "src/ckptzip/_native/python/module.c"
src = open(p).read().split("\n")
work = {93: "v.len", 116: "a.len", 138: "v.len", 177: "v.len", 217: "s.len", 281: "s.len",
        321: "a.len", 361: "x.len", 394: "16 * (size_t)x.len", 425: "4 * (size_t)x.len",
        472: "(size_t)v.len * (size_t)iterations", 523: "v.len", 652: "s.len", 710: "2 * (size_t)s.len",
        758: "c.len * (size_t)elem_size", 788: "s.len", 860: "4 * n", 912: "d.len",
        953: "4 * (size_t)d.len", 982: "16 * (size_t)x.len", 1015: "16 * (size_t)o.len",
        1045: "s.len", 1076: "16 * n", 1118: "s.len", 1182: "4 * (size_t)n", 1218: "4 * (size_t)n",
        1252: "4 * (size_t)n", 1290: "4 * (size_t)n", 1319: "4 * (size_t)n", 1346: "4 * (size_t)n",
        1378: "4 * (size_t)n", 1411: "n", 1476: "4 * n", 1540: "d.len", 1619: "n * (size_t)width",
        1674: "n", 1724: "n", 1762: "d.len", 1849: "4 * len", 1888: "2 * (size_t)d.len",
        2127: "n * (size_t)elem_size", 2155: "n * (size_t)elem_size"}
for line, expr in work.items():
    i = line - 1
    assert "Py_BEGIN_ALLOW_THREADS" in src[i], (line, src[i])
    src[i] = src[i].replace("Py_BEGIN_ALLOW_THREADS", f"CKZ_BEGIN_RELEASE({expr})")
    j = i + 1
    while "Py_END_ALLOW_THREADS" not in src[j]: j += 1
    src[j] = src[j].replace("Py_END_ALLOW_THREADS", "CKZ_END_RELEASE")
open(p, "w").write("\n".join(src))
