"""Build script for the native extension ``ckptzip._native``.

Everything else lives in pyproject.toml; setuptools needs this file only to describe the C module.
The extension uses the CPython buffer protocol and nothing from numpy's or torch's C API, so it
builds against any numpy/torch version.
"""

import glob
import os
import sys

from setuptools import Extension, setup

# core/: the codec, plain C (what the fuzz harnesses link); python/: the CPython bindings.
# src/ckptzip/_native/README.md has the layers.
NATIVE = os.path.join("src", "ckptzip", "_native")
LAYERS = ("core", "python")
sources = [path for layer in LAYERS for path in sorted(glob.glob(os.path.join(NATIVE, layer, "*.c")))]
extra_compile_args: list[str] = []
extra_link_args: list[str] = []
if sys.platform != "win32":
    # -fno-math-errno, -fno-trapping-math: sqrt is the instruction alone (no errno to set), and
    # a float operation may be computed in a lane whose result a select then drops, so that the
    # element-wise float kernels vectorize; neither changes a result (IEEE rounding stays, no
    # contraction under -std=c11), and nothing reads errno or the FP exception flags
    extra_compile_args = ["-O3", "-std=c11", "-fno-math-errno", "-fno-trapping-math",
                          "-Wall", "-Wextra", "-fno-strict-aliasing"]
    extra_compile_args += os.environ.get("CKPTZIP_CFLAGS", "").split()
    extra_link_args += ["-lpthread"] + os.environ.get("CKPTZIP_LDFLAGS", "").split()

setup(
    ext_modules=[
        Extension(
            "ckptzip._native",
            sources=sources,
            include_dirs=[os.path.join(NATIVE, layer) for layer in LAYERS],
            extra_compile_args=extra_compile_args,
            extra_link_args=extra_link_args,
        )
    ]
)
